"""SED-SFT's τ calibration as the official script does it, through the generic TokenLoss calibration hook."""
from __future__ import annotations

import math

import pytest
import torch

from common.config import ConfigError, compose
from common.config.common import computation_config
from common.config.sft import SEDSFTMethod
from common.paths import method_label
from sft.losses import Calibration, build_loss
from sft.token_stats import dense_loss, position_statistics

OFFICIAL = SEDSFTMethod(threshold_calibration="official", top_k=2, lambda_de=1.0)
MASSES = torch.tensor([0.9, 0.5, 0.7, 0.99, 0.6, 0.8, 0.95, 0.85, 0.4, 0.75])


def test_default_is_the_fixed_threshold_with_no_calibration_and_the_same_identity():
    loss = build_loss(SEDSFTMethod())
    assert loss.calibration() is None and loss.threshold == 0.95
    assert set(computation_config(SEDSFTMethod())) == {"name", "loss_norm", "lambda_de", "top_k", "threshold"}
    assert method_label(SEDSFTMethod()) == "sedsft"
    assert method_label(OFFICIAL) == "sedsft_threshold_calibrationofficial"
    assert compose(["sft/method=sedsft_official"]).sft.method == OFFICIAL


def test_official_calibration_asks_for_top10_masses_of_100_sequences():
    assert build_loss(OFFICIAL).calibration() == Calibration("topk_mass", {"top_k": 10}, 100)


def test_threshold_is_the_kth_largest_mass_as_the_official_code_takes_it():
    # k = int(0.7 * 10) = 7; sorted ascending [0.4 0.5 0.6 0.7 0.75 0.8 0.85 0.9 0.95 0.99], [-7] = 0.7
    constants = build_loss(OFFICIAL).calibrate(MASSES)
    assert constants == {"sed_threshold": pytest.approx(0.7), "sed_calibration_positions": 10.0}
    assert (MASSES < constants["sed_threshold"]).float().mean().item() == pytest.approx(0.3)
    # ratio 0.25: k = int(2.5) = 2, the second largest, 0.95
    ratio = build_loss(SEDSFTMethod(threshold_calibration="official", calibration_ratio=0.25))
    assert ratio.calibrate(MASSES)["sed_threshold"] == pytest.approx(0.95)
    with pytest.raises(ValueError, match="3 positions give no rank"):
        ratio.calibrate(MASSES[:3])


def test_position_statistics_are_chunked_top_k_masses_at_every_position():
    # logits row 0 = [ln 1, ln 2, ln 5] (p = 1/8, 2/8, 5/8), row 1 = [0, 0, 0] (p = 1/3 each)
    hidden = torch.eye(2)
    head = torch.tensor([[0.0, 0.0], [math.log(2), 0.0], [math.log(5), 0.0]])
    for chunk_size in (1, 2, 5):
        masses = position_statistics(hidden, head, ("topk_mass",), chunk_size=chunk_size, top_k=2)["topk_mass"]
        assert masses.tolist() == pytest.approx([7 / 8, 2 / 3], abs=1e-6)
    with pytest.raises(ValueError, match="need a target"):
        position_statistics(hidden, head, ("logp",), chunk_size=2)


def test_calibrated_threshold_decides_the_flexible_tokens():
    loss = build_loss(OFFICIAL)
    logits = torch.tensor([[[0.0, math.log(2), math.log(5)], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    labels = torch.tensor([[-100, 2, 0]])  # row 0 predicts 2 (p 5/8, top-2 mass 7/8), row 1 predicts 0 (p 1/3, 2/3)
    with pytest.raises(RuntimeError, match="not calibrated yet"):
        dense_loss(loss, logits, labels)
    loss.load_calibration(loss.calibrate(MASSES))  # tau 0.7: row 1 is flexible, row 0 rigid
    result = dense_loss(loss, logits, labels)
    expected = (-math.log(5 / 8) + -math.log(1 / 3) + (1 / 3 - 1 / 2) ** 2) / 2  # 0.798197
    assert result.loss.item() == pytest.approx(expected, abs=1e-6)
    assert result.loss.item() == pytest.approx(0.798197, abs=1e-6)
    assert result.metrics["sed_flexible_frac"].item() == pytest.approx(0.5)


def test_calibration_fields_are_validated_by_key():
    for key, value in (("threshold_calibration", "sometimes"), ("calibration_ratio", 0.0),
                       ("calibration_sequences", 0), ("calibration_top_k", 0)):
        with pytest.raises(ConfigError, match=f"sft.method.{key}"):
            SEDSFTMethod(**{key: value}).validate()
