"""Stage ``base`` (toy profile): build the toy tokenizer and pretrain the tiny Qwen3 base model on CPU.

    python -m toy.base experiment=demo profile=toy [toy.pretrain_steps=...]

Writes a standard HF folder (safetensors, tokenizer with chat template, generation config whose eos is the
template's ``<|im_end|>``) to ``toy_base_dir(cfg)/hf`` and a manifest to ``toy_base_dir(cfg)``. The folder is keyed
by the hash of the ``toy`` config, so re-runs and other experiments reuse it; an interrupted run resumes from its
last checkpoint. With ``toy.world=forking`` the manifest also holds the base model's entropy profile on its own
samples (mean H at the fork, on digits, elsewhere) and each strategy's share per family (docs/toy_world.md).
"""
from __future__ import annotations

import itertools
from dataclasses import asdict
from pathlib import Path

import torch

from common.config import Config, ConfigError, stage_main
from common.config.toy import ToyConfig
from common.manifest import Manifest, read_manifest, stage_run
from common.models import follow_umask
from common.paths import HF_EXPORT, TRAINING_METRICS_FILE, base_run, hf_export_dir
from common.seeding import derive_seed, seed_everything
from common.tracking import MetricsLogger, configure_cpu_threads, progress
from toy import pretrain, worlds
from toy.entropy import fork_profile
from toy.tokenizer import END_OF_TURN, train_tokenizer


def base_model_seed(toy: ToyConfig, purpose: str) -> int:
    """The seed of ``purpose`` (``model-init``, ``pretrain``) for the base model of ``toy.base_seed``: the world's own
    for base seed 0 (the base model as it always was), one per base seed otherwise."""
    return derive_seed(toy.world_seed, purpose if toy.base_seed == 0 else f"{purpose}/base{toy.base_seed}")


def pretrain_order(sequences: torch.Tensor, toy: ToyConfig) -> torch.Tensor:
    """The packed pretraining sequences in the order of ``toy.base_seed``: as packed for base seed 0, a seeded
    permutation of the same sequences otherwise (the same documents, another order)."""
    if toy.base_seed == 0:
        return sequences
    generator = torch.Generator().manual_seed(base_model_seed(toy, "pretrain-order"))
    return sequences[torch.randperm(len(sequences), generator=generator)]


def build_base(cfg: Config, out_dir: Path, *, device: str = "cpu") -> dict:
    """Tokenizer, model, pretraining and the HF export into ``out_dir/hf``; returns the headline metrics."""
    toy = cfg.toy
    tokenizer_docs = itertools.islice(worlds.documents(toy, derive_seed(toy.world_seed, "tokenizer-docs")),
                                      toy.num_pretrain_docs)
    tokenizer = train_tokenizer(tokenizer_docs, toy.vocab_size)
    if len(tokenizer.encode("\n", add_special_tokens=False)) != 1:
        raise RuntimeError("the toy tokenizer splits '\\n' into several tokens; verl's Qwen agent loop needs one")
    num_sequences = toy.pretrain_steps * toy.pretrain_batch_size
    documents = worlds.documents(toy, derive_seed(toy.world_seed, "pretrain-docs"))
    sequences = pretrain_order(pretrain.pack_documents(tokenizer, documents, num_sequences, toy.pretrain_seq_len),
                               toy)
    model = pretrain.build_model(
        tokenizer, hidden_size=toy.hidden_size, num_layers=toy.num_layers, num_heads=toy.num_heads,
        num_kv_heads=toy.num_kv_heads, intermediate_size=toy.intermediate_size,
        max_position_embeddings=toy.max_position_embeddings, seed=base_model_seed(toy, "model-init"))
    model.to(device)
    seed_everything(base_model_seed(toy, "pretrain"))
    num_params = sum(p.numel() for p in model.parameters())
    with MetricsLogger(out_dir / TRAINING_METRICS_FILE, wandb_mode=cfg.logging.wandb_mode,
                       wandb_project=cfg.logging.wandb_project, run_name=f"base/toy/{out_dir.name}",
                       config=asdict(toy)) as logger, \
            progress(total=toy.pretrain_steps, desc="toy base pretraining", enabled=cfg.logging.progress,
                     unit="step") as bar:
        def log(step: int, metrics: dict) -> None:
            if step % cfg.logging.log_every == 0 or step == toy.pretrain_steps:
                logger.log(step, metrics)
        metrics = pretrain.train(model, sequences, steps=toy.pretrain_steps, batch_size=toy.pretrain_batch_size,
                                 peak_lr=toy.pretrain_lr, checkpoint_path=out_dir / "checkpoint.pt",
                                 checkpoint_every=toy.pretrain_checkpoint_every, log=log, progress_bar=bar,
                                 dtype=getattr(torch, toy.pretrain_dtype))
        if toy.pretrain_eval_problems:
            problems = worlds.health_check_problems(toy, toy.pretrain_eval_problems,
                                                    derive_seed(toy.world_seed, "base-eval"))
            metrics["greedy_accuracy_heldout"] = pretrain.greedy_accuracy(
                model, tokenizer, problems, max_new_tokens=pretrain.EVAL_MAX_NEW_TOKENS, seed=toy.world_seed)
            logger.log(toy.pretrain_steps, {"greedy_accuracy_heldout": metrics["greedy_accuracy_heldout"]})
        if toy.world == "forking" and toy.fork_entropy_problems:
            metrics.update(fork_profile(model, tokenizer, toy))
            logger.log(toy.pretrain_steps, {k: v for k, v in metrics.items() if k.startswith("entropy_")})
    hf_dir = hf_export_dir(out_dir)
    model.to("cpu").save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    follow_umask(hf_dir)
    (out_dir / "checkpoint.pt").unlink(missing_ok=True)
    metrics.update(num_params=num_params, vocab_size=len(tokenizer), pretrain_tokens=sequences.numel(),
                   pretrain_dtype=toy.pretrain_dtype,
                   eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TURN))
    return metrics


def run(cfg: Config) -> Manifest:
    if cfg.model.source != "toy":
        raise ConfigError(f"toy.base builds the toy base model; model.source is {cfg.model.source!r} "
                          "(use model=toy profile=toy)")
    configure_cpu_threads(cfg.profile.num_threads)
    spec = base_run(cfg)
    out_dir = spec.directory
    with stage_run(out_dir, stage="base", variant=spec.variant, config=spec.config,
                   seeds={"world_seed": cfg.toy.world_seed, "base_seed": cfg.toy.base_seed}) as stage:
        if stage is None:
            return read_manifest(out_dir)
        stage.manifest.metrics.update(build_base(cfg, out_dir))
        stage.add_output(HF_EXPORT, "toy base model: safetensors, tokenizer + chat template, generation config")
        stage.add_output(TRAINING_METRICS_FILE, "pretraining loss, lr and grad norm per step")
    return stage.manifest


main = stage_main(run)


if __name__ == "__main__":
    main()
