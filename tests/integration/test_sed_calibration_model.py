"""SED-SFT's τ from a tiny random Qwen3 through the trainer's calibration hook equals the official script's
``compute_cumsum_threshold`` written out on the model's full logits, and an SFT run records the base model's τ."""
from __future__ import annotations

import random

import pytest
import torch

from bench.tiny_model import build_tiny_qwen3
from common.config.sft import SEDSFTMethod
from common.models import load_causal_lm
from common.paths import sft_tokens_path
from sft.calibration import calibrate_token_loss
from sft.data import read_sft_tokens
from sft.losses import build_loss
from sft.train import run
from sft_helpers import build_tiny_model, prepare_run

pytestmark = pytest.mark.integration


def official_threshold(model, sequences, top_k: int, ratio: float, num_samples: int) -> float:
    """The official ``compute_cumsum_threshold`` (train.py of pppa2019/SED-SFT), on full logits."""
    masses = []
    with torch.no_grad():
        for ids in sequences[:num_samples]:
            probs = torch.softmax(model(torch.tensor([ids])).logits, dim=-1)
            masses.extend(torch.topk(probs, k=top_k, dim=-1).values.sum(-1).squeeze(0).tolist())
    return sorted(masses)[-int(ratio * len(masses))]


def test_calibrated_threshold_is_the_official_one(tmp_path):
    model = load_causal_lm(str(build_tiny_qwen3(tmp_path / "tiny", dtype="float32")), dtype="float32").eval()
    rng = random.Random(0)
    sequences = [[rng.randrange(5, 300) for _ in range(rng.randint(4, 20))] for _ in range(5)]
    loss = build_loss(SEDSFTMethod(threshold_calibration="official", calibration_sequences=4))
    constants = calibrate_token_loss(loss, model, sequences, chunk_size=7, device=torch.device("cpu"))
    expected = official_threshold(model, sequences, top_k=10, ratio=0.7, num_samples=4)
    assert constants["sed_threshold"] == pytest.approx(expected, abs=1e-6)
    assert constants["sed_calibration_positions"] == sum(len(ids) for ids in sequences[:4])
    assert constants["sequences"] == 4
    loss.load_calibration(constants)
    assert loss.threshold == constants["sed_threshold"]
    assert calibrate_token_loss(build_loss(SEDSFTMethod()), model, sequences, 7, torch.device("cpu")) is None


def test_sft_run_calibrates_on_the_base_model_and_records_tau(tmp_path):
    model_dir = build_tiny_model(tmp_path / "tiny")
    cfg, _ = prepare_run(tmp_path, model_dir, num_rows=8, method="sedsft_official", micro_batch_size=2,
                         grad_accum=1, max_steps=1, **{"method.calibration_sequences": 3})
    manifest = run(cfg)
    assert manifest.complete
    sequences = [list(row.input_ids) for row in read_sft_tokens(sft_tokens_path(cfg))]
    base = load_causal_lm(str(model_dir), dtype="float32").eval()
    expected = official_threshold(base, sequences, top_k=10, ratio=0.7, num_samples=3)
    assert manifest.details["loss_calibration"]["sed_threshold"] == pytest.approx(expected, abs=1e-6)
    assert manifest.details["loss_calibration"]["sequences"] == 3
    assert manifest.metrics["sed_threshold"] == manifest.details["loss_calibration"]["sed_threshold"]
