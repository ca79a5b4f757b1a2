"""The tiny command lines of the benches that take minutes (tests/integration/test_bench_commands.py runs the rest):
``bench.vllm_vs_hf`` on vLLM-CPU, and ``bench.stage_overhead`` through the toy pipeline with verl's DAPO on Ray.
Each must exit 0 and print the line it exists for."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAGE_OVERHEAD_TINY = [
    "toy.pretrain_steps=20", "toy.num_pretrain_docs=500", "toy.num_rows=64", "toy.num_benchmark_problems=4",
    "toy.pretrain_eval_problems=0", "data.num_sft_rows=32", "data.num_rl_val_rows=8", "sft.max_steps=2",
    "eval.max_problems=2", "eval.n=2", "report.table_k=2", "rl.total_steps=1", "rl.save_freq=1",
    "rl.train_batch_size=8", "rl.ppo_mini_batch_size=8", "rl.rollout_n=4", "rl.max_response_length=64",
    "rl.overlong_buffer_len=16", "rl.max_inflight_gen_batches=2", "rl.micro_batch_size_per_gpu=8",
    "rl.filter_groups=false",  # a 20-step base answers nothing right: dynamic sampling would find no mixed group
    "rl.stall_timeout_s=1800",
]


@pytest.mark.parametrize("bench, arguments, expected", [
    pytest.param("vllm_vs_hf", ["--prompts", "1", "--n", "2", "--max-tokens", "8"],
                 r"ratio vLLM/HF tokens per second: \S+x", marks=pytest.mark.vllm, id="vllm_vs_hf"),
    pytest.param("stage_overhead", ["--compare-size", "2", *STAGE_OVERHEAD_TINY],
                 r"now: 32 problems per call, 1024 sequences .* /wall s",
                 marks=[pytest.mark.verl, pytest.mark.vllm], id="stage_overhead"),
])
@pytest.mark.e2e
def test_heavy_bench_command_line_runs_at_its_tiny_size(bench, arguments, expected):
    result = subprocess.run([sys.executable, "-m", f"bench.{bench}", *arguments], cwd=REPO, capture_output=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, text=True, timeout=3600)
    assert result.returncode == 0, f"bench.{bench} exited {result.returncode}:\n{result.stderr[-4000:]}"
    assert re.search(expected, result.stdout), \
        f"bench.{bench} printed no line matching {expected!r}:\n{result.stdout[-3000:]}"
