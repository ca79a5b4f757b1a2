"""``scripts/gpu_lora_check.py --dry-run``: the GPU check of EKSFT-LoRA against EKSFT-full through its own code at
the tiny CPU size (gloo, fp32); one results file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_gpu_lora_check_dry_run_times_both_trainers_and_writes_its_results(tmp_path):
    out = tmp_path / "results.json"
    command = [sys.executable, str(REPO / "scripts" / "gpu_lora_check.py"), "--dry-run", "--steps", "1", "--warmup", "1",
               "--profile", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(out.read_text())
    full, lora = results["trainers"]["full"], results["trainers"]["lora"]
    assert results["dry_run"] and results["tokens_per_step"] == 64
    assert full["median_step_s"] > 0 and lora["median_step_s"] > 0
    assert full["trainable_params"] == full["params"]
    assert 0 < lora["trainable_params"] < full["params"] / 4  # r 16 on a 128-wide model: 18% of it
    # full: policy + fp32 reference + two moments (16 B/param); LoRA: the base once, adapters with their moments
    assert lora["held_gib"] < full["held_gib"] / 2
    assert full["estimate_gib"] > lora["estimate_gib"] > lora["held_gib"]  # the preflight's estimate of each peak
    assert "lora/full: step time" in result.stdout
    for name in ("full", "lora"):  # one more step of each under torch.profiler: where LoRA's extra time goes
        table = Path(results["trainers"][name]["profile"]).read_text()
        assert table.startswith(f"## {name}\n") and "Self CPU time total" in table
