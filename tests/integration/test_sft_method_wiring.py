"""What a method asks of the trainer reaches it: the optimiser step (per-step random mask) and the method's own
loss normalisation (the official EKSFT preset's micro_batch_sum wins over sft.loss_norm)."""
from __future__ import annotations

from pathlib import Path

import pytest

import sft.losses
import sft.trainer
from sft.train import run
from sft_helpers import build_tiny_model, prepare_run

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
    assert run(cfg).complete
    assert norms == ["micro_batch_sum", "micro_batch_sum"]
