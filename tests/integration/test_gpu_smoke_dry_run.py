"""``scripts/gpu_smoke.sh --dry-run`` in CI: argument parsing, imports, the shapes of parts A and B, both run at tiny
CPU sizes through the GPU run's own code, and part C's command; one results file."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_gpu_smoke_dry_run_passes_and_writes_its_results(tmp_path):
    """The parts run in the order named (C first: the one a time limit cut off on an H200)."""
    out = tmp_path / "results.json"
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_smoke.sh"), "--dry-run", "--parts", "C", "A", "B",
                             "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["dry_run"] and results["ok"]
    assert [key for key in results if key in ("A", "B", "C")] == ["C", "A", "B"]
    assert {(case["head"], case["method"]) for case in results["A"]["cases"]} == {
        (head, method) for head in ("tied", "untied") for method in ("sft", "eksft")}
    assert set(results["B"]["methods"]) == {"eksft", "psft"}
    assert "-m sft.train" in results["C"]["command"] and "sft.checkpoint_every=1" in results["C"]["command"]


def test_gpu_smoke_refuses_unknown_parts():
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_smoke.sh"), "--dry-run", "--parts", "D"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "invalid choice: 'D'" in result.stderr
