"""What a method asks of the trainer reaches it: the optimiser step (per-step random mask), the method's own
loss normalisation (the official EKSFT preset's micro_batch_sum wins over sft.loss_norm) and, for EKSFT's Algorithm 1
(``selection_scope=optimizer_batch``), the statistics of every micro-batch on every rank before any backward."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import sft.losses
import sft.trainer
from common.config import compose
from common.manifest import read_manifest
from common.paths import TRAINING_METRICS_FILE, sft_dir
from common.tracking import read_metrics
from sft.train import run
from sft_helpers import build_tiny_model, final_weights, prepare_run, run_torchrun

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3"))


def test_random_mask_is_drawn_with_each_optimiser_step(tmp_path, model_dir, monkeypatch):
    steps = []
    draw = sft.losses.random_subset_mask

    def spy(*args, **kwargs):
        steps.append(args[-1])
        return draw(*args, **kwargs)

    monkeypatch.setattr(sft.losses, "random_subset_mask", spy)
    cfg, _ = prepare_run(tmp_path, model_dir, num_rows=8, method="eksft_random_mask", micro_batch_size=2,
                         grad_accum=2, max_steps=2)
    assert run(cfg).complete
    assert steps == [0, 0, 1, 1]  # one draw per micro-batch, each with its optimiser step


def test_official_preset_trains_with_its_own_loss_normalisation(tmp_path, model_dir, monkeypatch):
    norms = []
    weight = sft.trainer.micro_batch_weight

    def spy(loss_norm, **kwargs):
        norms.append(loss_norm)
        return weight(loss_norm, **kwargs)

    monkeypatch.setattr(sft.trainer, "micro_batch_weight", spy)
    cfg, _ = prepare_run(tmp_path, model_dir, num_rows=8, method="eksft_official", micro_batch_size=2,
                         grad_accum=2, max_steps=1, loss_norm="global_token_mean")
    manifest = run(cfg)
    assert manifest.complete
    assert norms == ["micro_batch_sum", "micro_batch_sum"]
    # the manifest records every switch the run computed with, the preset's resolved
    assert manifest.details["method"] == cfg.sft.resolved_method()
    assert manifest.details["method"]["kl_formula"] == "official_code"
    assert manifest.details["method"]["loss_norm"] == "micro_batch_sum"


def test_optimizer_batch_selection_over_ranks_and_micro_batches_equals_one_micro_batch(tmp_path, model_dir):
    """Algorithm 1 on 2 ranks × 2 micro-batches of 1 sequence (gloo) against 1 rank with one micro-batch of the same
    4 sequences and the micro-batch scope: the same selection (set sizes), the same step objectives and weights."""
    set_sizes = ("stats/num_M", "stats/num_M_H", "stats/num_M_KL", "stats/num_T")
    one_cfg, _ = prepare_run(tmp_path / "one", model_dir, num_rows=8, method="eksft", micro_batch_size=4,
                             grad_accum=1, **{"method.rho": 0.3})
    assert run(one_cfg).complete
    _, overrides = prepare_run(tmp_path / "two", model_dir, num_rows=8, method="eksft", micro_batch_size=1,
                               grad_accum=2, **{"method.rho": 0.3, "method.selection_scope": "optimizer_batch"})
    overrides = [*overrides, "profile.nproc_per_node=2"]
    result = run_torchrun(overrides, nproc=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    two_cfg = compose(overrides)
    assert read_manifest(sft_dir(two_cfg)).details["method"]["loss_norm"] == "optimizer_batch_parts"
    one = read_metrics(sft_dir(one_cfg) / TRAINING_METRICS_FILE)
    two = read_metrics(sft_dir(two_cfg) / TRAINING_METRICS_FILE)
    assert len(one) == len(two) == 2 and one[0]["stats/num_M"] > 0
    for a, b in zip(one, two):
        assert [b[key] for key in set_sizes] == [a[key] for key in set_sizes]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5) and b["grad_norm"] == pytest.approx(a["grad_norm"],
                                                                                                   rel=1e-4)
    one_weights, two_weights = final_weights(one_cfg), final_weights(two_cfg)
    for name, weight in one_weights.items():
        torch.testing.assert_close(two_weights[name], weight, rtol=0, atol=1e-4, msg=name)
