"""The real verl DAPO trainer on CPU: ``rl.train.run`` on a tiny Qwen3 with vLLM-CPU rollouts and group filtering.

The start model is a random tiny Qwen3 (head_dim 64, a tokenizer where "\\n" is one token) trained for a few
seconds to answer ``\\boxed{1}`` 90% and ``\\boxed{2}`` 10% of the time, so about two groups in three are
uniform (group filtering evicts them) and the rest are kept.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from common.manifest import Manifest, write_manifest

# ~3 min and ~9 GB RAM (Ray, vLLM-CPU, FSDP2 actor): too heavy for the default suite on a shared 2-core box.
pytestmark = [pytest.mark.vllm, pytest.mark.verl, pytest.mark.e2e]

PROMPT = [{"role": "user", "content": "Compute 3 - 1 or 4 - 3."}]
ANSWERS = ("1", "2")
ANSWER_WEIGHTS = (0.9, 0.1)


def build_start_model(folder: Path, *, steps: int = 60, seed: int = 0) -> Path:
    """A tiny Qwen3 that answers 'The answer is \\boxed{1}.' (p ~ 0.9) or '...{2}.' (p ~ 0.1)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.tiny_model import build_tiny_qwen3

    build_tiny_qwen3(folder, hidden_size=128, num_layers=2, dtype="float32", seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt_ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)["input_ids"]
    examples = []
    for answer in ANSWERS:
        response_ids = tokenizer(f"The answer is \\boxed{{{answer}}}.", add_special_tokens=False)["input_ids"]
        ids = prompt_ids + response_ids + [tokenizer.eos_token_id]
        labels = [-100] * len(prompt_ids) + response_ids + [tokenizer.eos_token_id]
        examples.append((torch.tensor([ids]), torch.tensor([labels])))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(seed)
    for _ in range(steps):
        # the weighted cross-entropy of the two answers is minimal at p(answer) = its weight
        loss = sum(weight * model(input_ids=ids, labels=labels).loss
                   for weight, (ids, labels) in zip(ANSWER_WEIGHTS, examples))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)
    return folder


def write_rl_parquet(path: Path, num_rows: int, split: str, seed: int = 0, ground_truth: str | None = None) -> None:
    """Rows in the data stage's verl RL format (gold answers drawn from ``ANSWERS``, or all ``ground_truth``)."""
    import pandas as pd

    rng = random.Random(seed)
    rows = [{"data_source": "toy", "prompt": PROMPT, "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": ground_truth or rng.choice(ANSWERS)},
             "extra_info": {"index": index, "split": split}} for index in range(num_rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)


def prepare_inputs(cfg, ground_truth: str | None = None) -> None:
    """The SFT export RL starts from (:func:`build_start_model`) and the RL data, with complete manifests."""
    from common.paths import data_dir, hf_export_dir, sft_run

    sft = sft_run(cfg)
    build_start_model(hf_export_dir(sft.directory))
    _complete(sft.directory, "sft", sft.config)
    write_rl_parquet(data_dir(cfg) / "rl.parquet", 32, "train", ground_truth=ground_truth)
    write_rl_parquet(data_dir(cfg) / "rl_val.parquet", 4, "val", seed=1, ground_truth=ground_truth)
    _complete(data_dir(cfg), "data")


def _complete(directory: Path, stage: str, config: dict | None = None) -> None:
    write_manifest(directory, Manifest(stage=stage, variant="test", status="complete", config=config or {}))


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory):
    from common.config import compose
    from rl.train import run

    root = tmp_path_factory.mktemp("rl")
    overrides = [f"experiment.run_root={root}", "sft/method=sft", "rl.init=sft", "rl.train_batch_size=4",
                 "rl.ppo_mini_batch_size=2",
                 "rl.rollout_n=4", "rl.total_steps=2", "rl.max_prompt_length=64", "rl.max_response_length=16",
                 "rl.overlong_buffer_len=4", "rl.micro_batch_size_per_gpu=8", "rl.save_freq=2", "rl.test_freq=0",
                 "rl.val_before_train=false", "rl.max_inflight_gen_batches=2", "logging.progress=false"]
    cfg = compose(overrides)
    prepare_inputs(cfg)
    return cfg, run(cfg)


def test_dapo_runs_to_the_last_step_and_hands_back_a_loadable_model(rl_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.paths import hf_export_dir, rl_dir
    from common.tracking import read_metrics

    cfg, manifest = rl_run
    stage = rl_dir(cfg)
    assert manifest.complete and manifest.metrics["final_step"] == 2
    records = {r["step"]: r for r in read_metrics(stage / "metrics.jsonl")}
    assert sorted(s for s in records if s > 0) == [1, 2]
    for step in (1, 2):
        # generation and training are timed separately
        assert records[step]["timing_s/gen"] > 0 and records[step]["timing_s/update_actor"] > 0
        assert -2.0 <= records[step]["critic/score/mean"] <= 1.0  # ±1 plus an overlong penalty of at most -1
    # with p(uniform group) ~ 0.66 over >= 8 groups, the filter evicts some (P(none) ~ 2e-4)
    assert sum(records[step].get("training/filter_groups/evicted_samples", 0) for step in (1, 2)) > 0
    assert manifest.metrics["time_generation_s_total"] > 0 and manifest.metrics["time_training_s_total"] > 0
    hf = hf_export_dir(stage)
    assert manifest.details["export"]["dtype"] == "bfloat16"  # verl's merger writes bf16
    tokenizer = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForCausalLM.from_pretrained(hf)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in [model.generation_config.eos_token_id] + list(
        model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list) else [])
    assert model.config.num_hidden_layers == 2
    json.dumps(manifest.details)  # the manifest stays plain JSON
    assert manifest.details["sft_method"] == {"name": "sft", "loss_norm": None}  # from the SFT run's manifest


def test_rerun_with_complete_manifest_is_skipped(rl_run):
    from rl.train import run

    cfg, manifest = rl_run
    again = run(cfg)
    assert again.run_id == manifest.run_id and again.complete
