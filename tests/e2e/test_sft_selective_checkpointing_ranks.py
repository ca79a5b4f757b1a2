"""``sft.gradient_checkpointing_policy=selective`` across FSDP2 ranks: a 2-rank torchrun of ``sft.train`` (gloo) with
selective checkpointing ends with the weights of a 1-rank run without checkpointing (EKSFT on the tiny model, the
same global batch). Each rank frees its layers' gathered parameters after their forward; the backward's recompute of
the norms and RoPE then reads parameters FSDP2 gathered again (about a minute: two launches)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from sft_helpers import build_tiny_model, final_weights, prepare_run, run_torchrun  # noqa: E402
from common.config import compose  # noqa: E402

pytestmark = pytest.mark.e2e


def test_two_ranks_with_selective_checkpointing_match_one_rank_without(tmp_path):
    model_dir = build_tiny_model(tmp_path / "model")
    weights = []
    for name, nproc, sft in (("plain", 1, {}), ("selective", 2, {"grad_accum": 1, "gradient_checkpointing": "true",
                                                                  "gradient_checkpointing_policy": "selective"})):
        _, overrides = prepare_run(tmp_path / name, model_dir, 8, method="eksft", **sft)
        overrides.append(f"profile.nproc_per_node={nproc}")
        result = run_torchrun(overrides, nproc=nproc)
        assert result.returncode == 0, result.stdout[-3000:]
        weights.append(final_weights(compose(overrides)))
    plain, selective = weights
    assert plain.keys() == selective.keys()
    for name, weight in plain.items():
        assert (selective[name] - weight).abs().max() < 1e-5, name
