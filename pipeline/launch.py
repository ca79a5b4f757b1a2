"""Runs one stage command as a subprocess: the only place the orchestrator starts processes.

A successful command leaves ``launch.json`` beside its manifest (the argv, a hash of the config it composed,
and the sha256 of each manifest it wrote). On the next run the orchestrator skips the command without starting
it when that record still matches; otherwise the stage itself decides (skip, resume or restart) from its manifest.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pipeline.manifest import config_hash, manifest_path, read_manifest, sha256_file
from pipeline.stages import StageCommand

LAUNCH_RECORD = "launch.json"
_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()


class StageFailed(RuntimeError):
    """A stage command exited non-zero or left an incomplete manifest."""


def _record_path(command: StageCommand) -> Path:
    return command.record_dir / LAUNCH_RECORD


def _expected_record(command: StageCommand) -> dict:
    return {"argv": command.argv[1:], "config_hash": config_hash(command.config)}


def is_done(command: StageCommand) -> bool:
    """True when every manifest is complete and unchanged since this exact command last succeeded."""
    record_file = _record_path(command)
    if not record_file.exists():
        return False
    record = json.loads(record_file.read_text(encoding="utf-8"))
    if {k: record.get(k) for k in ("argv", "config_hash")} != _expected_record(command):
        return False
    for directory in command.manifest_dirs:
        manifest = read_manifest(directory)
        if manifest is None or not manifest.complete:
            return False
        if record.get("manifests", {}).get(str(directory)) != sha256_file(manifest_path(directory)):
            return False
    return True


def stage_environment(device: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if device == "cpu":
        # Bounded OpenMP spinning: the default made steps 10-60x slower on a loaded 2-core machine.
        env.setdefault("GOMP_SPINCOUNT", "10000")
    return env


def stop(process: subprocess.Popen) -> None:
    """Interrupts a stage's whole process group (SIGINT, so it can record its state), then kills it after 30 s."""
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=stage_environment(command.config.profile.device), start_new_session=True)
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
    record = {**_expected_record(command),
              "manifests": {str(d): sha256_file(manifest_path(d)) for d in command.manifest_dirs},
              "wall_s": round(time.time() - started, 1)}
    _record_path(command).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return time.time() - started
