"""Process trees: a command started in its own session, and stopped with everything it started; termination
signals turned into Ctrl-C so that whoever started such a tree gets to stop it.

The orchestrator starts each stage command this way (``pipeline/launch.py``) and the RL stage starts verl this way
(``rl/train.py``), and so do the SFT integration tests (``tests/integration/sft_helpers.py``); all stop them
with :func:`stop_tree`.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Iterator


def start_in_new_session(argv: list[str], env: dict[str, str],
                         cwd: str | os.PathLike | None = None) -> subprocess.Popen:
    """Starts ``argv`` (in ``cwd``, default ours) as the leader of a new session and process group, its stdout and
    stderr merged into one text pipe (undecodable bytes replaced), so that :func:`stop_tree` reaches every process it
    starts."""
    return subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def stop_tree(process: subprocess.Popen, grace_s: float, first_signal: int = signal.SIGTERM) -> int:
    """Sends ``first_signal`` to the process group led by ``process`` and to every descendant (also those that left
    the group, e.g. Ray's raylet and workers), waits up to ``grace_s`` seconds for all of them to exit, then sends
    SIGKILL to whatever is left; returns the leader's exit status."""
    import psutil

    descendants = []
    if process.poll() is None:  # unreaped, so its pid still names it
        try:
            descendants = psutil.Process(process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for sig in (first_signal, signal.SIGKILL):
        if _group_alive(process.pid):
            os.killpg(process.pid, sig)
        for child in descendants:
            try:
                child.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        deadline = time.monotonic() + grace_s
        _, descendants = psutil.wait_procs(descendants, timeout=grace_s)
        while time.monotonic() < deadline:
            process.poll()  # reaps an exited leader, which would otherwise keep its group alive as a zombie
            if not _group_alive(process.pid):
                break
            time.sleep(0.2)
        if not descendants and not _group_alive(process.pid):
            break
    return process.wait()


@contextlib.contextmanager
def termination_signals_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does, so ``except``/``finally``
    clauses run: the orchestrator stops its stages' process groups, a stage stops the trees it started (verl and
    Ray's workers live in sessions of their own, which no signal to the stage reaches) and records 'failed'.

    SIGINT gets Python's own handler even when the process started with it ignored (a background job of a
    non-interactive shell: `nohup make demo &`, CI runners): children inherit an ignored SIGINT, and SIGINT is how
    a stage is asked to record its state before it is stopped."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    handlers = {signal.SIGTERM: interrupt, signal.SIGHUP: interrupt, signal.SIGINT: signal.default_int_handler}
    previous = {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
