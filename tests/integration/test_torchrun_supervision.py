"""Issue 32.2 with the real torchrun: a stage worker ends with its agent when the agent is killed with SIGKILL (the
agent starts workers in sessions of their own, so they used to train on, re-parented to PID 1)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
STAGE = ("import os, time\n"
         "from common.config import stage_main\n"
         "def body(cfg):\n"
         "    open(os.environ['PID_FILE'], 'w').write(f'{os.getpid()}\\n')\n"
         "    time.sleep(120)\n"
         "stage_main(body)()\n")


def test_a_stage_worker_ends_with_its_killed_torchrun_agent(tmp_path):
    script, pid_file = tmp_path / "stage.py", tmp_path / "worker.pid"
    script.write_text(STAGE)
    env = {**os.environ, "PID_FILE": str(pid_file), "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                              str(script), f"experiment.run_root={tmp_path}"], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.2)
    worker = psutil.Process(int(pid_file.read_text()))
    try:
        assert worker.ppid() == agent.pid and os.getsid(worker.pid) != os.getsid(agent.pid)
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        worker.wait(timeout=30)  # raises psutil.TimeoutExpired if it trains on
    finally:
        agent.kill()
        if worker.is_running():
            worker.kill()
