"""Every registered token loss trains the tiny Qwen3 through the same trainer (bf16 autocast, the CPU default) and
exports an HF folder that reloads with the in-memory model's log-probs and the chat template's EOS."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer, GenerationConfig

from common.paths import TRAINING_METRICS_FILE, hf_export_dir, sft_dir
from common.tracking import read_metrics
from sft.losses import TOKEN_LOSSES
from sft.train import run
from sft_helpers import HEADS, build_tiny_model, final_weights, prepare_run

pytestmark = pytest.mark.integration
UNTIED_METHODS = ["sft", "eksft", "psft"]
"""Run on the untied head (Qwen3-8B's layout) too: plain, with the reference's head, with the old policy's."""


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    return {head: build_tiny_model(tmp_path_factory.mktemp(f"tiny_qwen3_{head}"), head=head) for head in HEADS}


METHOD_OVERRIDES = {"profit": {"method.threshold": 0.0}}
"""The random tiny model gives every target about 1/V, below ProFit's τ = 0.1: it would (rightly) train nothing."""


@pytest.mark.parametrize("method, head", [(method, "tied") for method in sorted(TOKEN_LOSSES)]
                         + [(method, "untied") for method in UNTIED_METHODS])
def test_method_trains_and_exports(tmp_path, model_dirs, method, head):
    model_dir = model_dirs[head]
    cfg, _ = prepare_run(tmp_path, model_dir, num_rows=8, method=method, micro_batch_size=2, grad_accum=1,
                         max_steps=2, mixed_precision="bf16", lr=1e-2, warmup_ratio=0.0,
                         **METHOD_OVERRIDES.get(method, {}))
    manifest = run(cfg)

    assert manifest.complete and manifest.metrics["steps"] == 2
    records = read_metrics(sft_dir(cfg) / TRAINING_METRICS_FILE)
    assert len(records) == 2 and all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records)
    assert any(key.startswith("stats/") for key in records[0])

    base = load_file(model_dir / "model.safetensors")
    trained = final_weights(cfg)
    unchanged = [name for name in base if name in trained and (trained[name] == base[name]).all()]
    assert not unchanged, f"{method}: parameters did not change: {unchanged}"
    assert ("lm_head.weight" in trained) == (head == "untied")  # an untied head is exported as its own weight

    export = hf_export_dir(sft_dir(cfg))
    assert manifest.details["export"]["max_abs_logprob_diff"] < 1e-4
    assert AutoTokenizer.from_pretrained(export).eos_token == "<|im_end|>"
    assert GenerationConfig.from_pretrained(export).eos_token_id[0] == 2  # <|im_end|>, before the base eos
