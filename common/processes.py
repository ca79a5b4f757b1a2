"""Process trees: a command started in its own session, owned, dying with its parent, and stopped with everything it
started; termination signals turned into one Ctrl-C per process so that whoever started such a tree gets to stop it.

The orchestrator starts each stage command this way (``pipeline/launch.py``) and the RL stage starts verl this way
(``rl/train.py``), and so do the SFT integration tests (``tests/integration/sft_helpers.py``); all stop them
with :func:`stop_tree`.

Three mechanisms keep a tree from outliving its owner:

* **Parent-death signal.** :func:`start_in_new_session` gives the child ``PR_SET_PDEATHSIG`` (SIGTERM), so a
  stage dies with the orchestrator and verl with the RL stage even when that owner is killed with SIGKILL (the OOM
  killer, a scheduler's final kill); a torchrun worker sets it for its agent (:func:`die_with_agent`). Ray's local
  cluster does the same for its driver (``fate_share``).
* **Owner marker.** Every process started with ``owner=...`` carries the owner's token in ``EKSFT_OWNERS``, and so do
  its descendants (environments are inherited: Ray's workers, vLLM's engines, torchrun's workers), also after they
  leave the session or are re-parented to PID 1. :func:`owned_processes` finds them by that mark, so the orchestrator
  stops what a dead launcher left behind and a rerun stops what a killed run left writing.
* **One interrupt.** :func:`termination_signals_interrupt` turns the first SIGINT, SIGTERM or SIGHUP into one
  KeyboardInterrupt and ignores the ones that follow while the process stops (torchrun forwards the orchestrator's
  SIGINT as a second one); :func:`interrupts_deferred` holds a signal until a manifest write is done.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

OWNERS_ENV = "EKSFT_OWNERS"
"""Environment variable listing (``:``-separated) the owner tokens of a process: the commands and stages that started
it or one of its ancestors."""
PARENT_DEATH_SIGNAL = signal.SIGTERM
"""What a child gets when its parent dies: a stage treats it as Ctrl-C (records 'interrupted', stops its children)."""
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_DIE_WITH_PARENT = Path(__file__).resolve().with_name("_die_with_parent.py")


# --------------------------------------------------------------------------------------------- ownership
def owner_token(name: str) -> str:
    """The mark of an owner (a command, a run folder) in :data:`OWNERS_ENV`."""
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def owned_environment(env: dict[str, str], token: str) -> dict[str, str]:
    """``env`` with ``token`` added to the owners its processes carry."""
    owners = [t for t in env.get(OWNERS_ENV, "").split(":") if t]
    return {**env, OWNERS_ENV: ":".join(owners + [token])}


def owned_processes(token: str) -> list:
    """Live processes (psutil) of this user that carry ``token`` in their environment, wherever they are in the
    process tree, this process excluded."""
    import psutil

    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if token in process.environ().get(OWNERS_ENV, "").split(":") and \
                    process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_owned(token: str, grace_s: float, first_signal: int = signal.SIGTERM) -> list[int]:
    """Stops every process carrying ``token`` (``first_signal``, then SIGKILL after ``grace_s``); returns their PIDs."""
    import psutil

    stopped: list[int] = []
    for sig in (first_signal, signal.SIGKILL):
        processes = owned_processes(token)
        if not processes:
            break
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(sig)
            if process.pid not in stopped:
                stopped.append(process.pid)
        _wait_gone(processes, grace_s)
    return stopped


def _wait_gone(processes: list, timeout_s: float) -> None:
    """Waits until none of ``processes`` runs (zombies count as gone: their parent reaps them)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = []
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
        if not alive:
            return
        time.sleep(0.1)


# ------------------------------------------------------------------------------------------ parent death
def set_parent_death_signal(sig: int = PARENT_DEATH_SIGNAL) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``: this process gets ``sig`` when the thread that started it ends (for our
    launchers: the process). False where the kernel has no such call (not Linux)."""
    return _libc is not None and _libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def die_with_agent() -> None:
    """A worker started by torchrun's agent (``TORCHELASTIC_RUN_ID`` set) ends with the agent: the agent starts it in
    a session of its own, so without this a killed agent (``kill -9``, the OOM killer) leaves it training and writing
    its run folder, re-parented to PID 1. A process started some other way keeps its usual life."""
    if "TORCHELASTIC_RUN_ID" in os.environ and set_parent_death_signal() and os.getppid() == 1:
        os.kill(os.getpid(), PARENT_DEATH_SIGNAL)  # the agent died before the call


# ---------------------------------------------------------------------------------------------- trees
def start_in_new_session(argv: list[str], env: dict[str, str], cwd: str | os.PathLike | None = None, *,
                         owner: str | None = None) -> subprocess.Popen:
    """Starts ``argv`` (in ``cwd``, default ours) as the leader of a new session and process group, its stdout and
    stderr merged into one text pipe (undecodable bytes replaced), so that :func:`stop_tree` reaches every process it
    starts. The child gets :data:`PARENT_DEATH_SIGNAL` when we die (through ``_die_with_parent.py``, which sets it and
    execs ``argv``: same PID, same group); with ``owner`` (an :func:`owner_token`) it and every process it starts
    carry that mark (:func:`owned_processes`).

    Call it from a thread that lives as long as the child (the parent-death signal follows the starting thread): the
    main thread, or a pool thread."""
    if sys.platform.startswith("linux"):
        argv = [sys.executable, "-S", str(_DIE_WITH_PARENT), str(os.getpid()), str(int(PARENT_DEATH_SIGNAL)), *argv]
    return subprocess.Popen(argv, env=owned_environment(env, owner) if owner else env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def stop_tree(process: subprocess.Popen, grace_s: float, first_signal: int = signal.SIGTERM,
              owner: str | None = None) -> int:
    """Sends ``first_signal`` to the process group led by ``process``, to every descendant (also those that left
    the group, e.g. Ray's raylet and workers) and, with ``owner``, to every process carrying that token (also those
    re-parented away from the tree), waits up to ``grace_s`` seconds for all of them to exit, then sends SIGKILL to
    whatever is left; returns the leader's exit status."""
    import psutil

    descendants = []
    if process.poll() is None:  # unreaped, so its pid still names it
        try:
            descendants = psutil.Process(process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    if owner:
        known = {child.pid for child in descendants} | {process.pid}
        descendants += [p for p in owned_processes(owner) if p.pid not in known]
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


# ---------------------------------------------------------------------------------------------- signals
class _InterruptState:
    """Per process: the signal that interrupted it (None until one did), the depth of :func:`interrupts_deferred`
    blocks and a signal held by them."""

    active = False
    interrupted: str | None = None
    deferred = 0
    pending: str | None = None


_state = _InterruptState()


def _interrupt(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    if _state.interrupted is not None:
        return  # one interrupt per process: the stop it started is under way
    if _state.deferred:
        _state.pending = _state.pending or name
        return
    _state.interrupted = name
    raise KeyboardInterrupt(f"signal {name}")


def interrupted_by() -> str | None:
    """The signal that interrupted this process inside :func:`termination_signals_interrupt` (None: none did)."""
    return _state.interrupted


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """A signal arriving inside the block interrupts at its end, not in the middle (a manifest write is never cut
    between its temp file and its rename). Only the main thread receives signals; elsewhere this does nothing."""
    if not _state.active or threading.current_thread() is not threading.main_thread():
        yield
        return
    _state.deferred += 1
    try:
        yield
    finally:
        _state.deferred -= 1
        if not _state.deferred and _state.pending and _state.interrupted is None:
            _state.interrupted, _state.pending = _state.pending, None
            raise KeyboardInterrupt(f"signal {_state.interrupted}")


@contextlib.contextmanager
def termination_signals_interrupt() -> Iterator[None]:
    """Inside the block SIGINT, SIGTERM and SIGHUP raise one KeyboardInterrupt, as Ctrl-C does, so ``except``/
    ``finally`` clauses run: the orchestrator stops its stages' process groups, a stage stops the trees it started
    (verl and Ray's workers live in sessions of their own, which no signal to the stage reaches) and records
    'interrupted'. Signals after the first are ignored: the first one's stop is under way, and a second
    KeyboardInterrupt would cut it (e.g. the manifest write that records it).

    SIGINT is handled even when the process started with it ignored (a background job of a non-interactive shell:
    `nohup make demo &`, CI runners): children inherit an ignored SIGINT, and SIGINT is how a stage is asked to
    record its state before it is stopped."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, _interrupt) for signum in signals}
    saved = (_state.active, _state.interrupted, _state.deferred, _state.pending)
    _state.active, _state.interrupted, _state.deferred, _state.pending = True, None, 0, None
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _state.active, _state.interrupted, _state.deferred, _state.pending = saved
