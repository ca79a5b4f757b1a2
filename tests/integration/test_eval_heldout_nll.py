"""The held-out NLL on a tiny random Qwen3: vLLM's prompt log-probabilities equal the HF model's, the NLL equals the
SFT cross-entropy with the prompt masked, and the evaluation stage writes it as its own run (skipped when current)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bench.tiny_model import build_tiny_qwen3
from eval.heldout import heldout_nll
from eval.run import run
from eval.sample import HFSampler, VLLMSampler
from common.config import Config, compose
from common.manifest import read_manifest, stage_run
from common.models import load_causal_lm
from common.paths import HELDOUT_NLL, HELDOUT_NLL_DIR, HELDOUT_TOKENS_FILE, data_dir, heldout_nll_run, tokens_dir

pytestmark = pytest.mark.integration
IGNORE_INDEX = -100


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny_qwen3"), dtype="float32")


def rows(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Random token rows with a prompt of 3-6 tokens (label -100) and a response of 2-9 tokens; the first two share
    a prefix."""
    rng = random.Random(seed)
    input_ids, labels = [], []
    for _ in range(4):
        prompt = [rng.randrange(5, 300) for _ in range(rng.randint(3, 6))]
        response = [rng.randrange(5, 300) for _ in range(rng.randint(2, 9))]
        input_ids.append(prompt + response)
        labels.append([IGNORE_INDEX] * len(prompt) + response)
    input_ids[1][:3] = input_ids[0][:3]
    return input_ids, labels


def reference_nll(model_dir: Path, input_ids: list[list[int]], labels: list[list[int]]) -> float:
    """SFT's cross-entropy: shifted labels, -100 ignored, pooled over every supervised token of every row."""
    model = load_causal_lm(str(model_dir), dtype="float32").eval()
    total, count = 0.0, 0
    for ids, row_labels in zip(input_ids, labels):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1]
        target = torch.tensor(row_labels[1:])
        total += torch.nn.functional.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum").item()
        count += int((target != IGNORE_INDEX).sum())
    return total / count


def _config(root: Path, model: Path, *overrides: str) -> Config:
    return compose([f"experiment.run_root={root}", "experiment.name=t", "data=openr1_local",
                    "data.path=unused.parquet", "data.benchmark_dir=unused", "model.source=hub", f"model.path={model}",
                    "model.name=tiny",
                    "model.dtype=float32", "eval.benchmarks=[aime24]", "eval.n=1", "eval.max_tokens=4",
                    "eval.kv_cache_memory_bytes=67108864", "logging.progress=false", *overrides])


@pytest.mark.vllm
def test_vllm_prompt_logprobs_give_the_sft_cross_entropy(tmp_path, tiny_model, monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm_cache"))
    input_ids, labels = rows()
    cfg = _config(tmp_path, tiny_model, "eval.temperature=0.6", "eval.top_p=0.9")  # neither may touch the NLL
    sampler = VLLMSampler(str(tiny_model), cfg, max_model_len=64)
    first, again = sampler.prompt_logprobs(input_ids), sampler.prompt_logprobs(input_ids)  # again: prefix cache
    sampler.close()
    assert [row[0] for row in first] == [None] * len(input_ids)
    assert [len(row) for row in first] == [len(ids) for ids in input_ids]
    assert again == first
    hf = HFSampler(str(tiny_model), _config(tmp_path, tiny_model, "eval.backend=hf")).prompt_logprobs(input_ids)
    for vllm_row, hf_row in zip(first, hf):
        assert vllm_row[1:] == pytest.approx(hf_row[1:], abs=2e-4)
    expected = reference_nll(tiny_model, input_ids, labels)
    nll, tokens = heldout_nll(first, labels)
    assert tokens == sum(label != IGNORE_INDEX for row in labels for label in row)
    assert nll == pytest.approx(expected, rel=1e-4)
    assert heldout_nll(hf, labels)[0] == pytest.approx(expected, rel=1e-5)


def test_evaluation_stage_writes_the_heldout_nll_run_and_skips_it_when_current(tmp_path, tiny_model):
    cfg = _config(tmp_path, tiny_model, "eval.backend=hf", "data.num_heldout_rows=4", "eval.phase=sft",
                  "eval.variant=base")
    benchmarks = data_dir(cfg) / "benchmarks"
    benchmarks.mkdir(parents=True)
    (benchmarks / "aime24.jsonl").write_text(json.dumps(
        {"id": "p1", "problem": "1 + 1?", "answer": "2", "prompt": [{"role": "user", "content": "1 + 1?"}]}) + "\n")
    input_ids, labels = rows(seed=1)
    with stage_run(tokens_dir(cfg), stage="tokens", variant="tiny", config={"rows": "test"},
                   announce=lambda message: None) as tokens:
        pq.write_table(pa.table({"input_ids": input_ids, "labels": labels}), tokens_dir(cfg) / HELDOUT_TOKENS_FILE)
        tokens.add_output(HELDOUT_TOKENS_FILE, "held-out slice")

    summary = run(cfg)
    spec = heldout_nll_run(cfg, "base", None)
    assert spec.directory.name == HELDOUT_NLL_DIR
    assert spec.directory.parent.parent == data_dir(cfg).parents[1] / "eval" / "tiny" / "sft"
    manifest = read_manifest(spec.directory)
    assert manifest.complete and manifest.stage == "eval_sft"
    assert manifest.metrics[HELDOUT_NLL] == pytest.approx(reference_nll(tiny_model, input_ids, labels), rel=1e-5)
    assert manifest.metrics["num_rows"] == 4
    assert summary.metrics[HELDOUT_NLL_DIR] == manifest.metrics and summary.status == "complete"
    run(cfg)
    assert read_manifest(spec.directory).run_id == manifest.run_id
    # no slice: no run (and no identity change)
    assert heldout_nll_run(_config(tmp_path, tiny_model), "base", None) is None
