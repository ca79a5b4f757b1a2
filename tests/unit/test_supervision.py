"""Issue 32.2 and 32.3: supervised stage processes under kill -9 and repeated signals.

Each test runs a small process tree shaped like the real ones (the orchestrator → a launcher like torchrun's agent →
a worker in a session of its own → what the worker starts) and kills a part of it."""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from common.config import compose
from common.manifest import read_manifest
from common.paths import RunSpec
from pipeline.stages import StageCommand

REPO = Path(__file__).resolve().parents[2]


def _wait_for(path: Path, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear within {timeout_s} s")


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _gone_within(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := _alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _kill(pids: list[int]) -> None:
    for pid in _alive(pids):
        os.kill(pid, signal.SIGKILL)


WORKER = """\
import os, sys, time
from common.manifest import stage_run
from common.processes import die_with_agent, start_in_new_session, termination_signals_interrupt
die_with_agent()
folder, pids = sys.argv[1], sys.argv[2]
with termination_signals_interrupt():
    pass  # setup
    with stage_run(folder, stage='x', variant='worker', config={}) as run:
        # what a stage starts in a session of its own (verl and its Ray cluster under rl.train)
        helper = start_in_new_session([sys.executable, '-c', 'import time; time.sleep(120)'], dict(os.environ))
        with open(pids, 'a') as out:
            out.write(f'worker {os.getpid()}\\nhelper {helper.pid}\\n')
        time.sleep(120)
"""

LAUNCHER = """\
import os, subprocess, sys, time
# like torchrun's agent: the worker in a session of its own, with the agent's run id in its environment
worker = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], sys.argv[3]], start_new_session=True,
                          env={**os.environ, 'TORCHELASTIC_RUN_ID': 'test'})
with open(sys.argv[3], 'a') as out:
    out.write(f'launcher {os.getpid()}\\n')
sys.exit(worker.wait())
"""


def _launcher_command(tmp_path: Path, name: str = "sft") -> tuple[StageCommand, Path]:
    pids = tmp_path / f"{name}.pids"
    folder = tmp_path / name
    argv = [sys.executable, "-c", LAUNCHER, WORKER, str(folder), str(pids)]
    return StageCommand("sft", name, argv, [RunSpec("x", "worker", folder, {}, {})], compose([])), pids


def _orchestrator(tmp_path: Path, plan: list[StageCommand]) -> subprocess.Popen:
    """``pipeline.run.run_plan`` over ``plan`` in a process of its own (what ``python -m pipeline.run`` runs)."""
    (tmp_path / "plan.pkl").write_bytes(pickle.dumps(plan))
    script = ("import pickle; from pathlib import Path; from pipeline.run import run_plan\n"
              f"run_plan(pickle.load(open(r'{tmp_path}/plan.pkl', 'rb')), Path(r'{tmp_path}'), 'test orchestrator', "
              f"parallel={len(plan)})\n")
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _tree(pids_file: Path) -> dict[str, int]:
    text = _wait_for(pids_file)
    while len(text.splitlines()) < 3:
        time.sleep(0.05)
        text = pids_file.read_text()
    return {role: int(pid) for role, pid in (line.split() for line in text.splitlines())}


def test_a_killed_launcher_takes_its_worker_along_and_the_orchestrator_does_not_wait_for_it(tmp_path):
    # Issue 32.2: kill -9 of torchrun's agent left the sft.train worker (its own process group) re-parented to PID 1
    # and still writing the run folder; the orchestrator waited for it, then printed FAILED with status -9 while the
    # manifest said complete.
    command, pids_file = _launcher_command(tmp_path)
    orchestrator = _orchestrator(tmp_path, [command])
    tree = _tree(pids_file)
    try:
        os.kill(tree["launcher"], signal.SIGKILL)
        out, err = orchestrator.communicate(timeout=60)  # the worker sleeps for 120 s
        assert _gone_within([tree["worker"], tree["helper"]], 10) == []
        assert orchestrator.returncode == 1
        manifest = read_manifest(tmp_path / "sft")
        assert manifest.status == "interrupted"  # agrees with the failure the orchestrator reports
        assert "sft exited with status -9" in err and "interrupted" in err, err
    finally:
        orchestrator.kill()
        _kill(list(tree.values()))


def test_a_killed_orchestrator_takes_every_stage_tree_along(tmp_path):
    # Issue 32.2: kill -9 of the orchestrator (the OOM killer, a scheduler's final SIGKILL) left every running stage
    # alive, re-parented to PID 1, with the Ray clusters they had started.
    first, first_pids = _launcher_command(tmp_path, "first")
    second, second_pids = _launcher_command(tmp_path, "second")
    orchestrator = _orchestrator(tmp_path, [first, second])
    trees = [_tree(first_pids), _tree(second_pids)]
    pids = [pid for tree in trees for pid in tree.values()]
    try:
        orchestrator.kill()
        orchestrator.wait(timeout=10)
        assert _gone_within(pids, 30) == []
        for name in ("first", "second"):  # never 'running' without a live owner
            assert read_manifest(tmp_path / name).status == "interrupted"
    finally:
        _kill(pids)


def test_a_rerun_stops_what_a_killed_orchestrator_left_writing_before_it_starts(tmp_path):
    # A stage stuck where SIGTERM is ignored survives its orchestrator's SIGKILL and keeps the run folder's lock: the
    # rerun stops it first (it carries the command's owner mark) instead of failing on the lock or writing beside it.
    stubborn = WORKER.replace("pass  # setup", "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    pids = tmp_path / "sft.pids"
    argv = [sys.executable, "-c", LAUNCHER, stubborn, str(tmp_path / "sft"), str(pids)]
    spec = RunSpec("x", "worker", tmp_path / "sft", {}, {})
    command = StageCommand("sft", "sft", argv, [spec], compose([]))
    orchestrator = _orchestrator(tmp_path, [command])
    tree = _tree(pids)
    try:
        orchestrator.kill()
        orchestrator.wait(timeout=10)
        time.sleep(1.0)
        assert tree["worker"] in _alive([tree["worker"]])  # it ignored the parent-death signal
        pids.unlink()
        quick = [sys.executable, "-c", "import sys; from common.manifest import stage_run\n"
                 f"with stage_run(r'{tmp_path / 'sft'}', stage='x', variant='worker', config={{}}): pass"]
        rerun = _orchestrator(tmp_path, [StageCommand("sft", "sft", quick, [spec], compose([]))])
        out, err = rerun.communicate(timeout=90)
        assert rerun.returncode is not None and rerun.returncode == 0, err
        assert "left running by an earlier launch of this command" in err
        assert _alive([tree["worker"]]) == [] and read_manifest(tmp_path / "sft").status == "complete"
    finally:
        orchestrator.kill()
        _kill(list(tree.values()))


SLOW_MANIFEST_STAGE = """\
import os, sys, time
from common import manifest
from common.processes import termination_signals_interrupt
real_fsync = os.fsync
def slow_fsync(fd):  # a slow disk: the manifest write after the first signal lasts long enough for a second one
    time.sleep(1.0)
    real_fsync(fd)
with termination_signals_interrupt():
    with manifest.stage_run(sys.argv[1], stage='sft', variant='x', config={}) as run:
        manifest.os.fsync = slow_fsync
        print('ready', flush=True)
        time.sleep(60)
"""


def test_a_second_signal_during_the_interrupted_manifest_write_does_not_leave_it_running(tmp_path):
    # Issue 32.3: the SFT worker got SIGINT twice (from the orchestrator, then torchrun's "closing signal"); the first
    # interrupted dcp.save, the second interrupted write_manifest's fsync, and 'failed' was never recorded.
    stage = subprocess.Popen([sys.executable, "-c", SLOW_MANIFEST_STAGE, str(tmp_path)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert stage.stdout.readline() == "ready\n"
        stage.send_signal(signal.SIGINT)
        time.sleep(0.4)  # inside the slow write of the 'interrupted' manifest
        stage.send_signal(signal.SIGINT)
        stage.send_signal(signal.SIGTERM)
        stage.wait(timeout=30)
    finally:
        stage.kill()
    manifest = read_manifest(tmp_path)
    assert manifest.status == "interrupted" and "SIGINT" in manifest.error and manifest.ended_at


def test_sigterm_to_the_orchestrator_names_each_interrupted_stage_on_one_line_without_a_traceback(tmp_path):
    # Issue 32.3: the orchestrator exited 130 with a KeyboardInterrupt traceback instead of a one-line summary.
    first, first_pids = _launcher_command(tmp_path, "first")
    second, second_pids = _launcher_command(tmp_path, "second")
    orchestrator = _orchestrator(tmp_path, [first, second])
    pids = [pid for tree in (_tree(first_pids), _tree(second_pids)) for pid in tree.values()]
    try:
        orchestrator.send_signal(signal.SIGTERM)
        out, err = orchestrator.communicate(timeout=60)
        assert orchestrator.returncode == 130
        assert "Traceback" not in err, err
        lines = [line for line in err.splitlines() if ": interrupted (" in line]
        assert [line.split(":")[0] for line in lines] == ["[1/2] first", "[2/2] second"], err
        assert all(line.endswith(": interrupted (manifest: interrupted)") for line in lines), err
        assert "interrupted by SIGTERM" in err.splitlines()[-1]
        assert _gone_within(pids, 10) == []
    finally:
        orchestrator.kill()
        _kill(pids)


SHARED_BASE = """\
import pathlib, sys, time
from common.manifest import stage_run
folder, started = sys.argv[1], sys.argv[2]
with stage_run(folder, stage='base', variant='toy', config={}) as run:
    open(started, 'a').write('started\\n')
    deadline, said = time.monotonic() + 120, 'waiting' + ' for it'  # the log holds this script too
    while said not in (pathlib.Path(folder) / 'launch.log').read_text() and time.monotonic() < deadline:
        time.sleep(0.1)  # the build lasts until the other orchestrator waits for it
"""


def _shared_base_orchestrator(tmp_path: Path, experiment: str, shared: Path) -> subprocess.Popen:
    """An orchestrator of experiment ``experiment`` whose one command builds the base model in the shared folder."""
    argv = [sys.executable, "-c", SHARED_BASE, str(shared), str(tmp_path / "started")]
    command = StageCommand("base", "base/toy", argv, [RunSpec("base", "toy", shared, {}, {})], compose([]))
    (tmp_path / experiment).mkdir()
    return _orchestrator(tmp_path / experiment, [command])


def test_two_orchestrators_on_one_uncached_base_both_complete(tmp_path):
    # Issue 39, item 2: the base cache is shared across experiments, but the launch's process mark was its folder's and
    # the sweep for leftovers ran before any lock: the second orchestrator stopped the first's live base build as
    # "left running by an earlier launch", the first then the second's, and both failed.
    shared = tmp_path / "cache" / "base" / "key"
    first = _shared_base_orchestrator(tmp_path, "table1", shared)
    second = None
    try:
        _wait_for(tmp_path / "started")
        second = _shared_base_orchestrator(tmp_path, "table2", shared)
        first_out, first_err = first.communicate(timeout=90)
        second_out, second_err = second.communicate(timeout=90)
        assert first.returncode == 0 and second.returncode == 0, first_err + second_err
        assert "earlier launch" not in first_err + second_err
        assert f"is being run by PID {first.pid} on host" in second_err and "waiting for it" in second_err
        assert f"reusing the run in {shared} that PID {first.pid} on host" in second_err
        assert (tmp_path / "started").read_text() == "started\n"  # built once
        assert read_manifest(shared).status == "complete"
    finally:
        for orchestrator in (first, second):
            if orchestrator is not None:
                orchestrator.kill()
