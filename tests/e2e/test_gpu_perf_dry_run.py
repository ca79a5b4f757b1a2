"""``scripts/gpu_perf.py --dry-run``: the GPU measurement's own code at the tiny CPU size (the statistics pass eager
and compiled, static bytes per parameter, one step-time configuration); one results file. About 5 minutes on 2 busy
cores (three compilations, five trainers), so in the e2e tier; its parts run in the default suite through
tests/integration/test_bench_commands.py and tests/integration/test_sft_compiled.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_gpu_perf_dry_run_measures_and_writes_its_results(tmp_path):
    out = tmp_path / "results.json"
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_perf.py"), "--dry-run", "--configurations",
                             "eager", "+ selective checkpointing", "+ compiled pass B, fused AdamW", "--out", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["static_bytes_per_parameter"] == {"fp32": pytest.approx(16.0), "bf16": pytest.approx(14.0)}
    assert set(results["statistics"]["64"]["statistics_s"]) == {"eager", "compiled", "online", "unsplit"}
    eager = results["step_time"]["eager"]
    assert set(eager["ratios"]) == {"eksft", "eksft_cache"} and eager["ratios"]["eksft"] > 0
    selective = results["step_time"]["+ selective checkpointing"]  # SFT alone, for its MFU
    assert set(selective["median_s"]) == {"sft"} and selective["ratios"] == {}
    assert results["step_time"]["+ compiled pass B, fused AdamW"]["ratios"]["eksft_cache"] > 0
    assert "live/SFT" in result.stdout
    assert "## eksft_cache" in (tmp_path / "results.profile.txt").read_text()  # the first configuration profiled
