"""``force`` refuses to restart a run that a live stage process writes or reads (``check_force_in_use``),
``make clean-demo`` refuses to remove an experiment folder a live process uses (``pipeline.clean``), and
``live_holder`` tells a held lock from one whose holder has ended."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.config import ConfigError, compose
from common.errors import UserError
from common.locks import DirectoryLock, LockHeld, live_holder
from common.manifest import read_manifest
from pipeline.clean import remove_experiment
from pipeline.run import run
from pipeline.stages import build_plan

REPO = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, time
from common.locks import DirectoryLock
from common.manifest import Manifest, write_manifest
folder, upstream = sys.argv[1], sys.argv[2]
with DirectoryLock(folder, "rl toy/reader"):
    write_manifest(folder, Manifest(stage="rl", variant="reader",
                                    inputs={"data": {"path": upstream, "run_id": "0", "outputs": "0"}}))
    print("ready", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def stage_process():
    """Starts a process that holds ``folder``'s lock with a ``running`` manifest reading ``upstream``, as a stage in
    progress does; killed (SIGKILL: its lock record stays behind) at the end."""
    started = []

    def start(folder: Path, upstream: Path) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(upstream)], cwd=REPO,
                                   stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        started.append(process)
        assert process.stdout.readline().strip() == "ready"
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_live_holder_is_the_running_writer_and_none_once_it_has_ended(tmp_path, stage_process):
    folder = tmp_path / "reader"
    assert live_holder(folder) is None  # no lock file
    with DirectoryLock(folder, "ours"):
        assert live_holder(folder)["pid"] == os.getpid()
    assert live_holder(folder) is None  # released cleanly: an empty record
    process = stage_process(folder, tmp_path / "data")
    assert live_holder(folder)["pid"] == process.pid
    process.kill()
    process.wait()
    assert json.loads((folder / ".lock").read_text())["pid"] == process.pid  # the record stays behind
    assert live_holder(folder) is None


def test_a_pid_that_started_after_the_lock_was_taken_or_lives_elsewhere(tmp_path):
    lock = tmp_path / ".lock"
    record = {"pid": os.getpid(), "host": socket.gethostname(), "what": "x"}
    lock.write_text(json.dumps({**record, "since": "2000-01-01 00:00:00"}))
    assert live_holder(tmp_path) is None  # this PID was reused: it started after that holder
    lock.write_text(json.dumps({**record, "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
    assert live_holder(tmp_path)["pid"] == os.getpid()
    lock.write_text(json.dumps({**record, "host": "elsewhere", "since": "2000-01-01 00:00:00"}))
    assert live_holder(tmp_path)["host"] == "elsewhere"  # cannot be checked from here: taken as live


def test_force_refuses_a_run_that_a_live_stage_reads_and_names_it(tmp_path, stage_process):
    # Issue 40's first command forces the forking data run, which issue 42's RL runs read while they run in the same
    # run root: restarting it would have sent hours of their DAPO steps back to step 0 at their next launch.
    overrides = ["experiment=demo", f"experiment.run_root={tmp_path}", "dry_run=true", "experiment.stages=[data,sft]"]
    data_dir = next(command for command in build_plan(compose(overrides), []) if command.stage == "data").runs[0]
    reader = tmp_path / "demo" / "rl" / "toy" / "sft-reader"
    process = stage_process(reader, data_dir.directory)
    run(compose(overrides), [])  # nothing forced, nothing refused
    with pytest.raises(ConfigError) as error:
        run(compose([*overrides, "force=[data]"]), [])
    message = str(error.value)
    assert message.startswith(f"force=['data'] would restart runs that live stage processes use: "
                              f"{data_dir.directory} (read by {reader}: PID {process.pid} on host")
    assert "rl toy/reader" in message and "another experiment.run_root" in message and "\n" not in message
    run(compose([*overrides, "force=[sft]"]), [])  # a run it does not read may be forced
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert read_manifest(reader).status == "running"  # as a killed stage leaves it
    run(compose([*overrides, "force=[data]"]), [])


def test_force_refuses_a_run_that_a_live_stage_writes(tmp_path, stage_process):
    overrides = ["experiment=demo", f"experiment.run_root={tmp_path}", "dry_run=true", "experiment.stages=[data]"]
    data_dir = build_plan(compose(overrides), [])[0].runs[0].directory
    process = stage_process(data_dir, tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=rf"{data_dir} \(written by {data_dir}: PID {process.pid} on host"):
        run(compose([*overrides, "force=[data]"]), [])


def test_clean_refuses_an_experiment_folder_a_live_process_uses_and_removes_it_after(tmp_path, stage_process):
    # make clean-demo was `rm -rf runs/demo`, even while the demo ran there.
    demo = tmp_path / "demo"
    assert remove_experiment(demo) is False  # nothing there
    (demo / "sft" / "toy").mkdir(parents=True)
    with DirectoryLock(demo, "orchestrator of experiment demo"):
        with pytest.raises(LockHeld, match="orchestrator of experiment demo"):
            remove_experiment(demo)
    writer = stage_process(demo / "sft" / "toy" / "sft-writer", tmp_path / "cache" / "base")
    with pytest.raises(UserError, match=f"sft-writer.*written by .*PID {writer.pid}"):
        remove_experiment(demo)
    writer.kill()
    writer.wait()
    reader = stage_process(tmp_path / "own_data" / "sft" / "toy" / "sft-reader", demo / "sft" / "toy" / "sft-writer")
    with pytest.raises(UserError, match=f"read by .*sft-reader.*PID {reader.pid}"):
        remove_experiment(demo)
    assert (demo / "sft" / "toy").is_dir()
    reader.kill()
    reader.wait()
    assert remove_experiment(demo) is True
    assert not demo.exists()
