"""Runs one stage command as a subprocess: the only place the orchestrator starts processes.

A command is done when every run it writes is current by the same rule the stages apply to themselves
(:func:`common.manifest.is_current`: complete, same config, inputs unchanged, outputs intact); then the orchestrator
skips it without starting a process. A successful command leaves ``launch.json`` beside its manifest (argv, wall time),
written atomically, as a record of how it was run.

Supervision (``common/processes.py``): the command runs in a session of its own, gets SIGTERM if the orchestrator
dies, and it and everything it starts carry the command's owner mark. When its launcher exits (torchrun's agent
killed with ``kill -9``, a stage crashing), whatever still carries the mark is stopped rather than waited for.

One orchestrator launches a command's folder at a time: it holds the folder's launch lock (``.launch.lock``, whose
record names it and its launch's mark) while the command runs. Folders shared by experiments (the base cache,
``runs/cache/base/<key>``) are reached by several orchestrators: the second waits for the first's launch, naming
whose it is, then reuses the run if it completed. Only with the lock held is a mark an earlier launcher left in it
(an orchestrator killed with SIGKILL) swept: its processes are stopped, so no stray process writes the folder, and
a live launch's processes are never touched, since each launch has a mark of its own. The verdict follows the
manifests: a command whose runs are all complete and current has succeeded, whatever its exit status; any other has
failed or was interrupted, as its manifests say.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import IO

from common.locks import LAUNCH_LOCK_NAME, DirectoryLock, LockHeld, describe_holder
from common.manifest import StageInputError, invalidate, read_manifest, write_json_atomic
from common.processes import owner_token, start_in_new_session, stop_owned, stop_tree
from pipeline.stages import StageCommand
from common.numerics import pinned_kernels_env
from common.tracking import bound_openmp_spin

LAUNCH_RECORD = "launch.json"
STOP_GRACE_S = 30.0
LOCK_POLL_S = 1.0
_stopping = threading.Event()
"""Set by :func:`stop_all`: a command still waiting for another orchestrator's launch gives up."""
_running: dict[subprocess.Popen, str] = {}
"""Running stage commands and their owner marks."""
_running_lock = threading.Lock()


class StageFailed(RuntimeError):
    """A stage command exited non-zero or left an incomplete manifest; ``interrupted`` when a manifest says a signal
    stopped it."""

    def __init__(self, message: str, interrupted: bool = False):
        super().__init__(message)
        self.interrupted = interrupted


def is_done(command: StageCommand) -> bool:
    """True when every run the command writes is current (nothing it depends on changed since it completed)."""
    return all(run.is_current() for run in command.current_runs())


def force_restart(command: StageCommand, reason: str) -> None:
    """Marks every run of the command for a fresh restart (``force=[...]``)."""
    for run in command.runs:
        invalidate(run.directory, reason)


def stage_environment(device: str, cpu_isa: str) -> dict[str, str]:
    """This process's environment plus, on a CPU profile, bounded OpenMP spinning and the kernel pins of
    ``profile.cpu_isa`` (read by the libraries when they load, so they go into the child's environment)."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if device == "cpu":
        bound_openmp_spin(env)
    pinned_kernels_env(env, device, cpu_isa)
    return env


def launch_owner(command: StageCommand) -> str:
    """The owner mark of every process one launch of the command starts: its record folder and a fresh id, so two
    orchestrators launching the same shared folder never share one."""
    return owner_token(f"{command.record_dir.resolve()}:{uuid.uuid4().hex}")


def hold_launch(command: StageCommand, owner: str, log: IO[str], held: contextlib.ExitStack) -> dict:
    """Takes the command's launch lock into ``held``, waiting while another live orchestrator holds it (said once,
    naming whose it is); then stops what a launcher that died holding it left running. Returns the record of the
    launch waited for (``{}`` when none was)."""
    lock = DirectoryLock(command.record_dir, f"launch of {command.name}", file_name=LAUNCH_LOCK_NAME,
                         details={"owner": owner}, announce=lambda line: _note(line, log))
    waited_for: dict = {}
    while True:
        try:
            held.enter_context(lock)
            break
        except LockHeld as busy:
            if not waited_for:
                waited_for = busy.holder or {"pid": "?"}
                _note(f"[launch] {command.name}: {command.record_dir} is being run by {describe_holder(waited_for)}; "
                      "waiting for it", log)
            if _stopping.wait(LOCK_POLL_S):
                raise KeyboardInterrupt(f"stopped while waiting for {command.record_dir}")
    if lock.previous.get("owner"):
        _stop_leftovers(lock.previous["owner"], "left running by an earlier launch of this command", log, command.name)
    return waited_for


def stop(process: subprocess.Popen, owner: str | None = None) -> None:
    """Interrupts a stage's whole process tree and everything carrying its mark (SIGINT, so it can record its state),
    then kills it after 30 s."""
    stop_tree(process, STOP_GRACE_S, first_signal=signal.SIGINT, owner=owner)


def stop_all() -> None:
    """Stops every stage command still running (the orchestrator's Ctrl-C with commands in flight)."""
    _stopping.set()
    with _running_lock:
        processes = list(_running.items())
    for process, owner in processes:
        stop(process, owner)


def manifest_states(command: StageCommand) -> dict[str, tuple[str, str]]:
    """(status, recorded error) of each run the command writes, by folder: ``no manifest``, or ``unreadable`` with the
    error naming a corrupt one."""
    states = {}
    for directory in command.manifest_dirs:
        try:
            manifest = read_manifest(directory)
        except StageInputError as error:
            states[str(directory)] = ("unreadable", str(error))
            continue
        states[str(directory)] = ("no manifest", "") if manifest is None else (manifest.status, manifest.error)
    return states


def _copy_output(stream: IO[str], log: IO[str], echo: bool) -> None:
    for line in stream:
        if echo:
            sys.stdout.write(line)
        log.write(line)
        log.flush()  # the orchestrator's status line reads the log while the command runs


def _note(line: str, log: IO[str]) -> None:
    """A line of the launcher's own, in the command's log and on stderr."""
    log.write(line + "\n")
    log.flush()
    print(line, file=sys.stderr, flush=True)


def _stop_leftovers(owner: str, why: str, log: IO[str], name: str) -> None:
    """Stops the processes carrying ``owner`` that outlived their launcher, and says so in the log and on stderr."""
    stopped = stop_owned(owner, STOP_GRACE_S, signal.SIGINT)
    if stopped:
        _note(f"[launch] {name}: stopped {len(stopped)} process(es) {why} (PIDs {', '.join(map(str, stopped))})", log)


def run_command(command: StageCommand, *, echo: bool = True) -> float:
    """Runs the command with its output kept in ``launch.log`` (and streamed to stdout with ``echo``); returns
    its wall time in seconds."""
    command.record_dir.mkdir(parents=True, exist_ok=True)
    log_path = command.record_dir / "launch.log"
    owner = launch_owner(command)
    started = time.time()
    argv = [os.path.expandvars(arg) for arg in command.argv]
    with open(log_path, "a", encoding="utf-8") as log, contextlib.ExitStack() as held:
        waited_for = hold_launch(command, owner, log, held)
        if waited_for and is_done(command):
            _note(f"[launch] {command.name}: reusing the run in {command.record_dir} that PID "
                  f"{waited_for.get('pid', '?')} on host {waited_for.get('host', '?')} completed", log)
            return time.time() - started
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        profile = command.config.profile
        process = start_in_new_session(argv, stage_environment(profile.device, profile.cpu_isa), owner=owner)
        with _running_lock:
            _running[process] = owner
        reader = threading.Thread(target=_copy_output, args=(process.stdout, log, echo), daemon=True)
        reader.start()
        try:
            returncode = process.wait()
            # what outlived the launcher (a torchrun worker after its agent was killed) is stopped, not waited for
            _stop_leftovers(owner, f"that outlived its launcher (exit status {returncode})", log, command.name)
            reader.join(timeout=STOP_GRACE_S)
        except KeyboardInterrupt:
            stop(process, owner)
            raise
        finally:
            with _running_lock:
                _running.pop(process, None)
    if returncode != 0 and not is_done(command):
        states = manifest_states(command)
        described = "; ".join(f"{directory}: {status}" + (f" ({error})" if error else "")
                              for directory, (status, error) in states.items())
        raise StageFailed(f"{command.name} exited with status {returncode} ({described}); log: {log_path}",
                          interrupted=any(status == "interrupted" for status, _ in states.values()))
    if returncode != 0:
        print(f"{command.name} exited with status {returncode} after completing its runs; their manifests are "
              "complete and current, so it counts as done", file=sys.stderr, flush=True)
    incomplete = [str(d) for d in command.manifest_dirs if not ((m := read_manifest(d)) and m.complete)]
    if incomplete:
        raise StageFailed(f"{command.name} exited 0 but left no complete manifest in {incomplete}; log: {log_path}")
    wall_s = time.time() - started
    write_json_atomic(command.record_dir / LAUNCH_RECORD, {"argv": command.argv, "wall_s": round(wall_s, 1)})
    return wall_s
