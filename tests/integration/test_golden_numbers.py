"""Same command, same numbers: the tiny fixed pipeline of ``golden_pipeline.py`` (toy data, base pretraining, SFT and
EKSFT, vLLM-CPU evaluation) reproduces the numbers recorded in ``tests/assets/golden_numbers.json``, with 1 thread and
with 2, on whatever x86 CPU runs the suite.

The numbers depend on the dtypes (configuration) and on the kernels' instruction set, which ``profile.cpu_isa=avx2``
pins (common/numerics.py); thread counts do not change them. ``tolerance`` in the file says how close each kind of
number must be and why; ``recorded`` says where the numbers were measured and how to measure them again.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

from golden_pipeline import GOLDEN_FILE, REPO

THREADS = (1, 2)


def golden_numbers(stdout: str) -> dict[str, float]:
    lines = [line for line in stdout.splitlines() if line.startswith("GOLDEN ")]
    assert lines, stdout[-3000:]
    return json.loads(lines[-1].removeprefix("GOLDEN "))


def differences(measured: dict[str, float], golden: dict, tolerance: dict) -> list[str]:
    """Every number missing, extra, or off by more than the relative tolerance (so a recorded 0 must be 0)."""
    problems = sorted(set(golden) ^ set(measured))
    for key in sorted(set(golden) & set(measured)):
        if not math.isclose(measured[key], golden[key], rel_tol=tolerance["relative"], abs_tol=0.0):
            problems.append(f"{key}: {measured[key]!r}, recorded {golden[key]!r} "
                            f"(allowed ±{tolerance['relative']:g} relative)")
    return problems


def test_the_tiny_pipeline_gives_the_recorded_numbers_with_1_and_2_threads(tmp_path):
    recorded = json.loads(GOLDEN_FILE.read_text())
    script = REPO / "tests" / "integration" / "golden_pipeline.py"
    processes = {threads: subprocess.Popen(
        [sys.executable, str(script), "--run-root", str(tmp_path / f"threads{threads}"), "--threads", str(threads)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO) for threads in THREADS}
    failures = []
    for threads, process in processes.items():
        stdout, _ = process.communicate(timeout=1200)
        assert process.returncode == 0, stdout[-3000:]
        failures += [f"{threads} thread(s): {problem}"
                     for problem in differences(golden_numbers(stdout), recorded["numbers"], recorded["tolerance"])]
    assert not failures, "\n".join(failures)


def test_a_changed_number_is_caught():
    recorded = json.loads(GOLDEN_FILE.read_text())
    numbers, tolerance = recorded["numbers"], recorded["tolerance"]
    assert differences(dict(numbers), numbers, tolerance) == []
    loss = "base/final_loss"
    assert differences({**numbers, loss: numbers[loss] * (1 + 3 * tolerance["relative"])}, numbers, tolerance)
    sampled = "sft/toy_fork_plain/mean_response_tokens"
    assert differences({**numbers, sampled: numbers[sampled] + 1 / 256}, numbers, tolerance)  # one token more
    assert differences({key: value for key, value in numbers.items() if key != loss}, numbers, tolerance)
