"""Entry point of the SFT stage.

    torchrun --standalone --nproc_per_node=N -m sft.train experiment=demo profile=toy sft/method=eksft
    python -m sft.train ...          # one process: still FSDP2, on a 1-rank group

Multi-node uses torchrun's rendezvous (docs/sft.md). Reads the tokenised SFT split and the base model, trains with
:mod:`sft.trainer`, exports a verified HF folder with :mod:`sft.export`, and writes the stage manifest in
``common.paths.sft_dir(cfg)``. An incomplete run with the same config resumes from its latest checkpoint.
"""
from __future__ import annotations

import copy
import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from common.config import Config, ConfigError, SFTConfig, stage_main
from common.manifest import Manifest, input_records, read_manifest, sha256_path, stage_run
from common.models import load_causal_lm, load_tokenizer, local_model_dir
from common.paths import (
    HF_EXPORT,
    LORA_ADAPTER,
    TRAINING_METRICS_FILE,
    base_model_path,
    hf_export_dir,
    kernels_identity,
    lora_adapter_dir,
    reference_cache_dir,
    sft_run,
    sft_tokens_path,
)
from common.preflight import require_stage
from common.seeding import derive_seed, seed_everything
from common.tracking import MetricsLogger, configure_cpu_threads
from sft.checkpoint import CHECKPOINTS_DIR, Checkpointer
from sft.data import DataOrder, TokenisedRow, read_sft_tokens
from sft.distributed import DistEnv, broadcast_from_main, close_distributed, init_distributed, wait_for_main
from sft.export import export_hf
from sft.calibration import calibrate_token_loss
from sft.losses import TokenLoss, build_loss
from sft.optim import build_optimizer, build_scheduler, total_optimizer_steps
from sft.lora import OLD_ADAPTER, AdapterView, add_lora
from sft.policy import (
    FROZEN_DTYPES,
    PolicyWithTokenLoss,
    checkpoint_decoder_layers,
    compile_decoder_layers,
    freeze,
    frozen_head_copy,
    shard_models,
    sharded_reference_trunk,
)
from sft.reference_cache import ReferenceCache, build_reference_cache, cache_identity, identity_key
from sft.trainer import fit, keep_metrics_up_to

EXPORT_CHECK_SEQUENCES = 3
"""Training sequences on which the exported model's log-probs are compared with the in-memory model's."""
EXPORT_CHECK_TOKENS = 64
"""Leading tokens of each of those sequences."""


def export_dtype(cfg: Config) -> torch.dtype:
    """``model.export_dtype``, else ``model.dtype``."""
    return getattr(torch, cfg.model.export_dtype or cfg.model.dtype)


def forward_dtype(cfg: Config, env: DistEnv) -> torch.dtype:
    """Precision of a forward outside autocast: bf16 under FSDP2 mixed precision (GPU), else float32."""
    return torch.bfloat16 if env.device.type == "cuda" and cfg.sft.mixed_precision == "bf16" else torch.float32


def resolve_model_dir(cfg: Config, env: DistEnv) -> str:
    """A local folder for the base model: the path itself, or the hub snapshot, downloaded by rank 0 first while the
    others wait up to ``sft.download_timeout_s`` (:func:`sft.distributed.wait_for_main`)."""
    path = base_model_path(cfg)
    if not Path(path).exists():
        wait_for_main(lambda: local_model_dir(path), env, cfg.sft.download_timeout_s)
    return local_model_dir(path)


def load_base_model(cfg: Config, model_dir: str) -> PreTrainedModel:
    """The full base model in float32 (``from_pretrained``: safetensors, or a GGUF file dequantised)."""
    return load_causal_lm(model_dir, gguf_file=cfg.model.gguf_file,
                          attn_implementation=cfg.model.attn_implementation, dtype=torch.float32)


@dataclass
class BaseModel:
    """The base model, which every trainer copy starts from, without a full copy on every rank: rank 0 holds the
    full float32 model (``full``, None on the other ranks); every rank has its config and generation config, from
    which :meth:`empty_copy` builds weightless copies to shard and then fill with :func:`load_from_main`."""

    full: PreTrainedModel | None
    config: PretrainedConfig
    generation_config: GenerationConfig

    def empty_copy(self) -> PreTrainedModel:
        """A float32 copy of the architecture on the meta device (no memory, no values), with its own config."""
        config = copy.deepcopy(self.config)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                    attn_implementation=config._attn_implementation)


def load_base_on_main(cfg: Config, model_dir: str, env: DistEnv) -> BaseModel:
    """Collective: rank 0 loads the full base model (:func:`load_base_model`, so GGUF too) and sends every rank its
    config and generation config."""
    full = load_base_model(cfg, model_dir) if env.is_main else None
    config, generation_config = broadcast_from_main((full.config, full.generation_config) if env.is_main else None)
    return BaseModel(full, config, generation_config)


@torch.no_grad()
def load_from_main(root: nn.Module, parts: list[tuple[nn.Module | None, nn.Module | None]], env: DistEnv) -> None:
    """Collective, after ``fully_shard``: materialises the meta-device ``root`` on ``env.device`` and gives each
    ``(target, source)`` submodule of it the values of rank 0's ``source`` (None elsewhere; same structure as
    ``target``), each rank keeping only its shards.

    Parameters and persistent buffers go one tensor at a time (``set_model_state_dict`` with
    ``full_state_dict`` and ``broadcast_from_rank0``), so no other rank ever holds more than one full tensor; tied
    weights stay one parameter. Non-persistent buffers (RoPE ``inv_freq``), which no state dict carries, are
    broadcast from rank 0's source after. Pairs whose target is None are skipped.
    """
    root.to_empty(device=env.device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    for target, source in parts:
        if target is None:
            continue
        set_model_state_dict(target, source.state_dict() if env.is_main else {}, options=options)
        source_buffers = dict(source.named_buffers(remove_duplicate=False)) if env.is_main else {}
        for name, buffer in target.named_buffers(remove_duplicate=False):
            if env.is_main:
                buffer.copy_(source_buffers[name])
            dist.broadcast(buffer, src=0)


def load_reference_trunk(cfg: Config, model_dir: str,
                         env: DistEnv) -> tuple[PreTrainedModel, Callable[[torch.Tensor], torch.Tensor]]:
    """Collective: the frozen reference with its trunk sharded (``sft.policy.sharded_reference_trunk``) and
    filled from rank 0's base model (its LM head stays on the meta device, unused), and the trunk's no-grad
    ``input_ids → final hidden states`` function."""
    base = load_base_on_main(cfg, model_dir, env)
    reference = base.empty_copy()
    hidden_states = sharded_reference_trunk(reference, env, cfg.sft.mixed_precision, cfg.sft.frozen_dtype)
    trunk = reference.get_decoder()
    load_from_main(trunk, [(trunk, base.full.get_decoder() if env.is_main else None)], env)
    return reference, hidden_states


def prepare_reference_cache(cfg: Config, model_dir: str, tokens_path: Path, rows: list[TokenisedRow],
                            env: DistEnv, announce: Callable[[str], None]) -> ReferenceCache | None:
    """Collective: with ``sft.reference_cache`` and a loss that needs the reference, the complete cache of the
    reference's final hidden states for ``rows`` (built now by the sharded reference if it is missing or partial);
    else None. Its folder is keyed by the base model's and the split's content hashes and the precision."""
    if not cfg.sft.reference_cache or not build_loss(cfg.sft.method).needs_reference:
        return None
    base_input = Path(model_dir) / cfg.model.gguf_file if cfg.model.gguf_file else Path(model_dir)
    identity = broadcast_from_main(cache_identity(
        base_model_sha256=sha256_path(base_input), sft_tokens_sha256=sha256_path(tokens_path),
        attn_implementation=cfg.model.attn_implementation, gguf_file=cfg.model.gguf_file,
        device_type=env.device.type, mixed_precision=cfg.sft.mixed_precision, frozen_dtype=cfg.sft.frozen_dtype,
        kernels=kernels_identity(cfg))
        if env.is_main else None)
    folder = reference_cache_dir(cfg, identity_key(identity))
    manifest = read_manifest(folder) if env.is_main else None
    if not broadcast_from_main(manifest is not None and manifest.complete):
        reference, hidden_states = load_reference_trunk(cfg, model_dir, env)
        build_reference_cache(folder, identity, input_ids=[row.input_ids for row in rows],
                              hidden_size=reference.config.hidden_size, hidden_states=hidden_states,
                              rank=env.rank, world_size=env.world_size, announce=announce)
        del reference
    announce(f"[sft] reference hidden states from {folder} (the reference trunk does not run)")
    return ReferenceCache(folder, identity)


def build_root(cfg: Config, model_dir: str, env: DistEnv, cached_reference: bool = False,
               calibration_sequences: Sequence[Sequence[int]] = ()) -> tuple[PolicyWithTokenLoss, GenerationConfig]:
    """The FSDP2-sharded policy plus the frozen models its loss needs (:func:`root_from_base`) from the base model
    in ``model_dir``, and the base generation config.

    Rank 0 holds the one full copy of the base model (:func:`load_base_on_main`): a rank holds its shards, not
    whole models. A loss that asks for a calibration (``TokenLoss.calibration``) gets it from that copy, on
    ``calibration_sequences``, before anything trains."""
    token_loss = build_loss(cfg.sft.method)
    base = load_base_on_main(cfg, model_dir, env)
    if token_loss.calibration() is not None:
        token_loss.load_calibration(broadcast_from_main(calibrate_token_loss(
            token_loss, base.full, calibration_sequences, cfg.sft.chunk_size, env.device) if env.is_main else None))
    return root_from_base(cfg.sft, token_loss, base, env, cached_reference), base.generation_config


def root_from_base(sft: SFTConfig, token_loss: TokenLoss, base: BaseModel, env: DistEnv,
                   cached_reference: bool = False) -> PolicyWithTokenLoss:
    """Collective: the FSDP2-sharded policy plus the frozen models ``token_loss`` needs (only the reference's LM
    head when ``cached_reference``), each built on the meta device from ``base``, sharded, then filled from rank 0's
    ``base.full`` (:func:`load_from_main`). With ``sft.lora`` the adapters go on before sharding and the frozen
    models are views of the policy (:mod:`sft.lora`); a cached reference's rows then meet the policy's own frozen
    head."""
    policy = base.empty_copy()
    if sft.gradient_checkpointing:
        checkpoint_decoder_layers(policy, sft.gradient_checkpointing_policy, sft.lora.rank if sft.lora.enabled else 0)
    frozen_dtype = sft.frozen_dtype
    full = base.full
    head_options = dict(compile_statistics=sft.compile_statistics, online_statistics=sft.online_statistics,
                        compile_pass_b=sft.compile_pass_b, kept_logits_chunks=sft.kept_logits_chunks)
    if sft.lora.enabled:  # the reference and old policy are views of the policy's own layers (sft/lora.py)
        adapters = dict(settings=sft.lora, old_adapter=token_loss.needs_old_policy,
                        frozen_dtype=FROZEN_DTYPES[frozen_dtype])
        policy = add_lora(policy, **adapters)
        full = add_lora(full, **adapters) if env.is_main else None  # rank 0 initialises the adapters
        root = PolicyWithTokenLoss(
            policy, token_loss, sft.chunk_size,
            reference=AdapterView(policy) if token_loss.needs_reference else None,
            old_policy=AdapterView(policy, OLD_ADAPTER) if token_loss.needs_old_policy else None,
            **head_options)
    else:
        live_reference = token_loss.needs_reference and not cached_reference
        root = PolicyWithTokenLoss(
            policy, token_loss, sft.chunk_size,
            reference=freeze(base.empty_copy(), frozen_dtype) if live_reference else None,
            old_policy=freeze(base.empty_copy(), frozen_dtype) if token_loss.needs_old_policy else None,
            reference_head=frozen_head_copy(base.empty_copy(), frozen_dtype) if cached_reference else None,
            **head_options)
    if sft.compile_layers:
        for model in root.models():
            compile_decoder_layers(model)
    shard_models(root, env, sft.mixed_precision)
    parts = [(root.policy, full), (root.reference, full), (root.old_policy, full),
             (root.reference_head, full.get_output_embeddings() if env.is_main else None)]
    load_from_main(root, [(target, source) for target, source in parts if isinstance(target, nn.Module)], env)
    return root


def export_policy(cfg: Config, root: PolicyWithTokenLoss, tokenizer: PreTrainedTokenizerBase,
                  generation_config: GenerationConfig, rows: list[TokenisedRow], out_dir: Path, env: DistEnv,
                  announce: Callable[[str], None]) -> dict | None:
    """Collective: writes and verifies ``hf/`` (see :mod:`sft.export`); the check record on rank 0."""

    def policy_logprobs(input_ids: torch.Tensor) -> torch.Tensor:
        root.eval()
        with torch.no_grad():
            logits = root(input_ids=input_ids.to(env.device))
        root.reshard()  # the root keeps its parameters unsharded after a forward without backward
        return logits.float().log_softmax(-1)

    check_sequences = [torch.tensor(row.input_ids[:EXPORT_CHECK_TOKENS]).unsqueeze(0)
                       for row in rows[:EXPORT_CHECK_SEQUENCES]]
    return export_hf(policy_logprobs, root.policy, tokenizer=tokenizer, generation_config=generation_config,
                     sequences=check_sequences, folder=hf_export_dir(out_dir), dtype=export_dtype(cfg),
                     compute_dtype=forward_dtype(cfg, env), is_main=env.is_main, device=env.device,
                     announce=announce, adapter_folder=lora_adapter_dir(out_dir))


def run(cfg: Config) -> Manifest:
    """Trains, exports and records one SFT method on one base model; returns the stage manifest."""
    require_stage(cfg, "sft")  # common/preflight.py: no CUDA/GPUs, flash-attn, model path, before any rank starts
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    configure_cpu_threads(max(1, cfg.profile.num_threads // local_world))
    env = init_distributed(cfg.profile.device, timeout_s=cfg.sft.process_group_timeout_s)
    try:
        return _run(cfg, env)
    finally:
        close_distributed(env)


def _run(cfg: Config, env: DistEnv) -> Manifest:
    started = time.perf_counter()
    announce = print if env.is_main else (lambda message: None)
    spec = sft_run(cfg)
    out_dir, variant = spec.directory, spec.variant
    world_size = spec.config["world_size"]
    if env.world_size != world_size:
        raise ConfigError(f"sft.train runs on {env.world_size} processes but profile.nproc_per_node x profile.nnodes "
                          f"is {world_size}; launch it with that many (the world size is part of the run's identity)")
    input_records(spec.inputs)  # every rank fails alike, before any collective, when an input is missing
    tokens_path = sft_tokens_path(cfg)
    model_dir = resolve_model_dir(cfg, env)
    order_seed = derive_seed(cfg.seed, "sft/data_order")
    train_seed = derive_seed(cfg.seed, f"sft/train/rank{env.rank}")
    config_record = spec.config

    stage_context = stage_run(out_dir, stage="sft", variant=variant, config=config_record, inputs=spec.inputs,
                              seeds={"seed": cfg.seed, "data_order": order_seed,
                                     "train_rank0": derive_seed(cfg.seed, "sft/train/rank0")},
                              announce=announce) if env.is_main else nullcontext()
    with stage_context as stage:
        decision = broadcast_from_main(None if stage is None else "resume" if stage.resumed else "fresh")
        if stage is not None:  # every setting the method computes with, its preset's switches resolved
            stage.manifest.details["method"] = cfg.sft.resolved_method()
        if decision is not None:
            seed_everything(train_seed)
            rows = read_sft_tokens(tokens_path, require_behaviour=cfg.sft.method.reads_behaviour_logprobs())
            order = DataOrder([len(row.input_ids) for row in rows], micro_batch_size=cfg.sft.micro_batch_size,
                              grad_accum=cfg.sft.grad_accum, world_size=env.world_size, order_seed=order_seed)
            tokenizer = load_tokenizer(model_dir, gguf_file=cfg.model.gguf_file)

            reference_cache = prepare_reference_cache(cfg, model_dir, tokens_path, rows, env, announce)
            root, generation_config = build_root(cfg, model_dir, env, cached_reference=reference_cache is not None,
                                                 calibration_sequences=[row.input_ids for row in rows])
            optimizer = build_optimizer(root, cfg.sft)
            total_steps = total_optimizer_steps(cfg.sft, order.steps_per_epoch)
            scheduler = build_scheduler(optimizer, cfg.sft, total_steps)
            checkpointer = Checkpointer(out_dir, keep=cfg.sft.keep_checkpoints, env=env)
            state = checkpointer.restore_or_start(root, optimizer, scheduler, order=order, total_steps=total_steps,
                                                  resume=decision == "resume", announce=announce)
            if env.is_main:  # metric lines after the restored step get redone; the export is rewritten at the end
                keep_metrics_up_to(out_dir / TRAINING_METRICS_FILE, state.global_step)
                shutil.rmtree(hf_export_dir(out_dir), ignore_errors=True)
                shutil.rmtree(lora_adapter_dir(out_dir), ignore_errors=True)
            with MetricsLogger(out_dir / TRAINING_METRICS_FILE, enabled=env.is_main, wandb_mode=cfg.logging.wandb_mode,
                               wandb_project=cfg.logging.wandb_project, config=config_record,
                               group=cfg.experiment.name,
                               run_name=cfg.logging.run_name or f"{cfg.experiment.name}/sft/{variant}") as logger:
                summary = fit(root, optimizer, scheduler, checkpointer, state, rows=rows, order=order,
                              pad_token_id=tokenizer.pad_token_id, sft=cfg.sft, env=env, logger=logger,
                              show_progress=env.is_main and cfg.logging.progress, log_every=cfg.logging.log_every,
                              reference_cache=reference_cache)
            if summary.steps == 0 or summary.steps != summary.total_steps:
                raise RuntimeError(f"training stopped after {summary.steps} of {summary.total_steps} optimiser "
                                   "steps; the run is not complete")

            export_started = time.perf_counter()
            export_record = export_policy(cfg, root, tokenizer, generation_config, rows, out_dir, env, announce)
            if env.is_main:
                export_record["time_s"] = time.perf_counter() - export_started
                wall = time.perf_counter() - started
                stage.manifest.metrics = {
                    "final_loss": summary.final_loss, "steps": summary.steps,
                    "supervised_tokens": summary.supervised_tokens, "input_tokens": summary.input_tokens,
                    "train_time_s": summary.train_time_s, "wall_time_s": wall,
                    "tokens_per_s": summary.input_tokens / max(summary.train_time_s, 1e-9)}
                if root.token_loss.calibrated:
                    stage.manifest.details["loss_calibration"] = root.token_loss.calibrated
                    stage.manifest.metrics.update(root.token_loss.calibrated)
                stage.manifest.details.update({
                    "resumed_from_step": summary.resumed_from_step, "steps_this_launch": summary.steps_this_launch,
                    "steps_per_epoch": order.steps_per_epoch, "global_batch": order.global_batch,
                    "world_size": env.world_size, "num_rows": len(rows),
                    "rows_unused_per_epoch": len(rows) - order.steps_per_epoch * order.global_batch,
                    "export": export_record})
                stage.add_output(HF_EXPORT, "HF safetensors + tokenizer + generation config (eos = chat end-of-turn)")
                if cfg.sft.lora.enabled:
                    stage.add_output(LORA_ADAPTER, "the trained LoRA adapter alone (merged into hf/)")
                stage.add_output(TRAINING_METRICS_FILE, "one JSON line per logged optimiser step")
                stage.add_output(CHECKPOINTS_DIR, "resumable DCP checkpoints (latest kept)", verify=False)
    dist.barrier()
    if env.is_main and stage is not None:
        return stage.manifest
    return read_manifest(out_dir)


main = stage_main(run)


if __name__ == "__main__":
    main()
