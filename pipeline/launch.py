"""Runs one stage command as a subprocess: the only place the orchestrator starts processes.

A command is done when every run it writes is current by the same rule the stages apply to themselves
(:func:`common.manifest.is_current`: complete, same config, inputs unchanged, outputs intact); then the orchestrator
skips it without starting a process. A successful command leaves ``launch.json`` beside its manifest (argv, wall time),
written atomically, as a record of how it was run.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from common.manifest import invalidate, is_current, read_manifest, write_json_atomic
from common.processes import start_in_new_session, stop_tree
from pipeline.stages import StageCommand
from common.numerics import pinned_kernels_env
from common.tracking import bound_openmp_spin

LAUNCH_RECORD = "launch.json"
STOP_GRACE_S = 30.0
_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()


class StageFailed(RuntimeError):
    """A stage command exited non-zero or left an incomplete manifest."""


def is_done(command: StageCommand) -> bool:
    """True when every run the command writes is current (nothing it depends on changed since it completed)."""
    return all(is_current(run.directory, run.config_hash, run.inputs, optional_inputs=run.optional_inputs)
               for run in command.current_runs())


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


def stop(process: subprocess.Popen) -> None:
    """Interrupts a stage's whole process tree (SIGINT, so it can record its state), then kills it after 30 s."""
    stop_tree(process, STOP_GRACE_S, first_signal=signal.SIGINT)


def stop_all() -> None:
    """Stops every stage command still running (the orchestrator's Ctrl-C with commands in flight)."""
    with _running_lock:
        processes = list(_running)
    for process in processes:
        stop(process)


def run_command(command: StageCommand, *, echo: bool = True) -> float:
    """Runs the command with its output kept in ``launch.log`` (and streamed to stdout with ``echo``); returns
    its wall time in seconds."""
    command.record_dir.mkdir(parents=True, exist_ok=True)
    log_path = command.record_dir / "launch.log"
    started = time.time()
    argv = [os.path.expandvars(arg) for arg in command.argv]
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        profile = command.config.profile
        process = start_in_new_session(argv, stage_environment(profile.device, profile.cpu_isa))
        with _running_lock:
            _running.add(process)
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if echo:
                    sys.stdout.write(line)
                log.write(line)
                log.flush()  # the orchestrator's status line reads the log while the command runs
            returncode = process.wait()
        except KeyboardInterrupt:
            stop(process)
            raise
        finally:
            with _running_lock:
                _running.discard(process)
    if returncode != 0:
        reasons = [f"{d}: {m.error}" for d in command.manifest_dirs
                   if (m := read_manifest(d)) is not None and m.error]
        raise StageFailed(f"{command.name} exited with status {returncode}"
                          + (f" ({'; '.join(reasons)})" if reasons else "") + f"; log: {log_path}")
    incomplete = [str(d) for d in command.manifest_dirs if not ((m := read_manifest(d)) and m.complete)]
    if incomplete:
        raise StageFailed(f"{command.name} exited 0 but left no complete manifest in {incomplete}; log: {log_path}")
    wall_s = time.time() - started
    write_json_atomic(command.record_dir / LAUNCH_RECORD, {"argv": command.argv, "wall_s": round(wall_s, 1)})
    return wall_s
