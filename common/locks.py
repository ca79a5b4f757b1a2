"""One writer per folder: an exclusive ``flock`` on ``<folder>/.lock``, held for as long as a process writes there.

The stage process holds its run folder's lock (``common.manifest.stage_run``), the orchestrator its experiment's.
A second process fails at once with :class:`LockHeld`, naming the PID, host and command of the holder. The kernel
releases a ``flock`` when its holder dies, so a dead process's lock is taken over, with a message naming it. On
network file systems this relies on their ``flock`` support (NFSv4, Lustre with ``flock`` mounts).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable

from common.errors import UserError


class LockHeld(UserError, RuntimeError):
    """Another live process writes this folder."""


def existing_parent(path: str | Path) -> Path:
    """``path`` or its nearest ancestor that this user can see (``os.path.exists``: False when a folder on the way is
    a file or cannot be searched)."""
    path = Path(path).expanduser().absolute()
    while not os.path.exists(path):
        path = path.parent
    return path


def unwritable(folder: str | Path) -> str | None:
    """Why this user cannot create or write ``folder`` (a folder on the way is a file; the nearest existing folder is
    not writable); None if it can. Nothing is created."""
    folder = Path(folder).expanduser().absolute()
    existing = existing_parent(folder)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return ("it is not writable" if existing == folder else f"it cannot be created: {existing} is not writable") \
            + " by this user"
    return None


class DirectoryLock:
    """Context manager holding ``<directory>/.lock`` exclusively; ``what`` names the work in messages."""

    FILE_NAME = ".lock"

    def __init__(self, directory: str | Path, what: str, announce: Callable[[str], None] = print):
        self.path = Path(directory) / self.FILE_NAME
        self.what = what
        self.announce = announce
        self._fd: int | None = None

    def __enter__(self) -> "DirectoryLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockHeld(f"{self.path.parent} is being written by PID {holder.get('pid', '?')} on host "
                           f"{holder.get('host', '?')} since {holder.get('since', '?')} ({holder.get('what', '?')}: "
                           f"{holder.get('command', '?')}); wait for it or stop it") from None
        previous = _read_holder(fd)
        if previous:
            self.announce(f"[lock] taking over {self.path}: its writer (PID {previous.get('pid')} on "
                          f"{previous.get('host')}, {previous.get('what')}) ended without releasing it")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "what": self.what,
                  "since": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)[:500]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc_info) -> None:
        assert self._fd is not None
        os.ftruncate(self._fd, 0)  # an empty file means "released cleanly"
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _read_holder(fd: int) -> dict:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
        return json.loads(text) if text else {}
    except (OSError, ValueError):
        return {}
