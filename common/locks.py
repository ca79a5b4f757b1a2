"""One writer per folder: an exclusive ``flock`` on ``<folder>/.lock``, held for as long as a process writes there.

The stage process holds its run folder's lock (``common.manifest.stage_run``), the orchestrator its experiment's and,
while it launches a command, that command folder's ``.launch.lock``.
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
import tempfile
import time
from pathlib import Path
from typing import Callable

from common.errors import UserError


LAUNCH_LOCK_NAME = ".launch.lock"
"""The lock an orchestrator holds on a command's folder while it launches the command (``pipeline/launch.py``)."""


class LockHeld(UserError, RuntimeError):
    """Another live process writes this folder; ``holder`` is its record (pid, host, what, since, command)."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def describe_holder(holder: dict, *, command: bool = True) -> str:
    """Whose a lock is, as the holder recorded it: ``PID <pid> on host <host> since <time> (<what>: <command>)``;
    without its command line when ``command`` is False."""
    doing = f"{holder.get('what', '?')}: {holder.get('command', '?')}" if command else holder.get('what', '?')
    return f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')} since {holder.get('since', '?')} ({doing})"


def live_holder(directory: str | Path) -> dict | None:
    """The record of the process holding ``<directory>/.lock`` while it still runs; None when the lock is free,
    released, or its holder ended without releasing it. Read without taking the lock, so a writer starting at that
    moment is never refused. On this host the PID must exist and have started by the record's ``since`` (a PID reused
    later is not the holder); a holder on another host cannot be checked from here and counts as live."""
    try:
        fd = os.open(Path(directory) / DirectoryLock.FILE_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        holder = _read_holder(fd)
    finally:
        os.close(fd)
    if not holder:
        return None
    if holder.get("host") != socket.gethostname():
        return holder
    import psutil
    try:
        started = psutil.Process(int(holder["pid"])).create_time()
        since = time.mktime(time.strptime(holder["since"], "%Y-%m-%d %H:%M:%S"))
    except psutil.AccessDenied:  # it exists, and its start cannot be read: taken as the holder
        return holder
    except (psutil.NoSuchProcess, KeyError, TypeError, ValueError):
        return None
    return holder if started <= since + 1 else None


def existing_parent(path: str | Path) -> Path:
    """``path`` or its nearest ancestor that this user can see (``os.path.exists``: False when a folder on the way is
    a file or cannot be searched)."""
    path = Path(path).expanduser().absolute()
    while not os.path.exists(path):
        path = path.parent
    return path


def unwritable(folder: str | Path) -> str | None:
    """Why this user cannot create or write ``folder`` (a folder on the way is a file; the nearest existing folder is
    not writable, or refuses a new entry: ``/sys``, a read-only mount, even for root); None if it can. Nothing is
    left behind: the probe folder goes at once."""
    folder = Path(folder).expanduser().absolute()
    existing = existing_parent(folder)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return ("it is not writable" if existing == folder else f"it cannot be created: {existing} is not writable") \
            + " by this user"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".eksft-probe-", dir=existing))
    except OSError as error:
        return f"{existing} refuses new files ({error.strerror})"
    return None


class DirectoryLock:
    """Context manager holding ``<directory>/<file_name>`` (``.lock``) exclusively; ``what`` names the work in
    messages, ``details`` go into the holder's record beside it. ``previous`` is the record of a holder that ended
    without releasing the lock (``{}`` when it was released cleanly)."""

    FILE_NAME = ".lock"

    def __init__(self, directory: str | Path, what: str, announce: Callable[[str], None] = print, *,
                 file_name: str = FILE_NAME, details: dict | None = None):
        self.path = Path(directory) / file_name
        self.what = what
        self.announce = announce
        self.details = dict(details or {})
        self.previous: dict = {}
        self._fd: int | None = None

    def __enter__(self) -> "DirectoryLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockHeld(f"{self.path.parent} is being written by {describe_holder(holder)}; wait for it or stop "
                           "it", holder) from None
        self.previous = _read_holder(fd)
        if self.previous:
            self.announce(f"[lock] taking over {self.path}: its writer (PID {self.previous.get('pid')} on "
                          f"{self.previous.get('host')}, {self.previous.get('what')}) ended without releasing it")
        record = {**self.details, "pid": os.getpid(), "host": socket.gethostname(), "what": self.what,
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
