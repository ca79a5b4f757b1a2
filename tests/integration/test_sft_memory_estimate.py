"""The preflight's SFT memory estimate bounds what one real trainer step allocates: the tiny random Qwen3, 256 tokens,
fp32 on one gloo rank, EKSFT full and LoRA (``bench.sft_memory_estimate``: held bytes plus the CPU
allocator's peak during the second step, counted from the profiler's allocation events, no timing). Measured on
2026-11-27: 1.34 and 1.42 times the step's bytes (docs/results/2026-11-27-sft-memory-estimate.md)."""
from __future__ import annotations

import pytest

from bench.sft_memory_estimate import compare, cpu_trainer_args, save_config
from sft_helpers import one_rank  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration
WITHIN = 1.6
"""How far above the measured bytes the estimate may be."""


def test_the_estimate_is_an_upper_bound_within_its_factor_of_a_measured_step(tmp_path, one_rank):
    model_dir = save_config("tiny", tmp_path / "tiny")
    full, lora = (compare("eksft", adapters, cpu_trainer_args("tiny", 256), model_dir, one_rank)
                  for adapters in (False, True))
    for row in (full, lora):
        assert row["measured"] <= row["estimate"] <= WITHIN * row["measured"], row
    assert lora["measured"] < full["measured"] and lora["estimate"] < full["estimate"]


def test_selective_checkpointing_with_lora_keeps_less_than_none_and_the_estimate_bounds_it(tmp_path, one_rank):
    """Selective checkpointing keeps the projections' outputs and each adapter's A output, and recomputes each
    adapter's B (``sft.policy.selective_policy``): keeping B's outputs too had held more than no checkpointing and
    above the estimate (0.88 of the step at 1,024 tokens, docs/results/2026-11-27-sft-memory-estimate-selective.md)."""
    model_dir = save_config("tiny", tmp_path / "tiny")
    selective, none = (compare("eksft", True, cpu_trainer_args("tiny", 1024, **options), model_dir, one_rank)
                       for options in ({"checkpointing_policy": "selective"}, {"gradient_checkpointing": False}))
    assert selective["measured"] <= selective["estimate"] <= WITHIN * selective["measured"], selective
    assert selective["measured"] < none["measured"]
