"""common.processes: a command in its own session, and its whole tree stopped (grace, then SIGKILL)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from common.processes import start_in_new_session, stop_tree


def _gone(process: psutil.Process) -> bool:
    return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE


def test_stop_tree_kills_children_that_ignore_the_first_signal():
    process = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 60 & sleep 60 & wait"], start_new_session=True)
    time.sleep(0.5)
    children = psutil.Process(process.pid).children(recursive=True)
    assert len(children) == 2
    assert stop_tree(process, grace_s=1.0) == -signal.SIGKILL
    assert all(_gone(child) for child in children)


def test_stop_tree_reaches_a_descendant_that_left_the_group():
    process = subprocess.Popen(["bash", "-c", "setsid sleep 60 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while not (children := psutil.Process(process.pid).children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = children
    while child.name() != "sleep" and time.monotonic() < deadline:  # setsid execs sleep in its own session
        time.sleep(0.05)
    assert os.getpgid(child.pid) != process.pid  # out of the group: the group signal alone would miss it
    stop_tree(process, grace_s=5.0)
    assert _gone(child)


def test_a_command_that_handles_the_first_signal_exits_with_its_own_status_without_waiting_the_grace():
    script = ("import signal, sys, time; signal.signal(signal.SIGINT, lambda *_: sys.exit(3)); "
              "print('ready', flush=True); time.sleep(60)")
    process = start_in_new_session([sys.executable, "-c", script], dict(os.environ))
    assert os.getsid(process.pid) == os.getpgid(process.pid) == process.pid
    assert process.stdout.readline() == "ready\n"
    started = time.monotonic()
    assert stop_tree(process, grace_s=60.0, first_signal=signal.SIGINT) == 3
    assert time.monotonic() - started < 30
