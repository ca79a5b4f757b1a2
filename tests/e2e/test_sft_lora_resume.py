"""EKSFT-LoRA through ``sft.train`` on 2 gloo ranks, killed with SIGKILL after the checkpoint of step 2 and resumed,
ends with the uninterrupted run's adapter bitwise (accelerate #4206's failure was a resume that kept only rank 0's
adapter slice). Two 2-rank launches beside tests/integration/test_sft_lora.py's uninterrupted run; the default suite
restores every rank's adapter and optimiser shards bitwise from a DCP checkpoint in one launch."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from sft_helpers import kill_after_checkpoint, prepare_run, run_torchrun  # noqa: E402
from test_sft_lora import NUM_ROWS, TRAIN, trained_run  # noqa: E402,F401 (its fixture)
from common.config import compose  # noqa: E402
from common.manifest import read_manifest  # noqa: E402
from common.paths import lora_adapter_dir, sft_dir  # noqa: E402
from sft.checkpoint import CHECKPOINTS_DIR  # noqa: E402

pytestmark = pytest.mark.e2e


def test_sigkill_and_resume_on_two_ranks_ends_with_the_uninterrupted_adapter_bitwise(tmp_path, trained_run):
    _, overrides = prepare_run(tmp_path, Path(trained_run.model.path), NUM_ROWS, "eksft", **TRAIN)
    overrides = [*overrides, "profile.nproc_per_node=2"]
    killed_dir = sft_dir(compose(overrides))
    kill_after_checkpoint(overrides, killed_dir / CHECKPOINTS_DIR / "step_000002", nproc=2)
    assert not read_manifest(killed_dir).complete, "the run finished before it was killed"
    result = run_torchrun(overrides, nproc=2)
    assert result.returncode == 0, result.stdout[-4000:]
    manifest = read_manifest(killed_dir)
    assert manifest.complete and 2 <= manifest.details["resumed_from_step"] < 4
    expected = load_file(lora_adapter_dir(sft_dir(trained_run)) / "adapter_model.safetensors")
    resumed = load_file(lora_adapter_dir(killed_dir) / "adapter_model.safetensors")
    assert expected.keys() == resumed.keys() and len(expected) == 12
    assert all(torch.equal(resumed[name], expected[name]) for name in expected)
    assert all(expected[name].abs().sum() > 0 for name in expected if "lora_B" in name)
