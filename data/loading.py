"""Loading the training set (hub id or local parquet/jsonl, both through ``datasets.load_dataset``) with row checks."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data.schema import InvalidRowError, check_row
from pipeline.config.data import DataConfig

MAX_RECORDED_INVALID_ROWS = 20


@dataclass
class LoadedRows:
    """Valid rows (with their index in the source as ``row_id``) and what was skipped."""

    rows: list[dict[str, Any]]
    row_ids: list[int]
    source: dict[str, Any]
    """What was loaded: hub id + revision + fingerprint, or the local file."""
    num_source_rows: int
    invalid: list[dict[str, Any]] = field(default_factory=list)
    """First invalid rows: {row, field, reason} (all of them are counted in ``invalid_by_field``)."""
    invalid_by_field: dict[str, int] = field(default_factory=dict)

    @property
    def num_invalid(self) -> int:
        return sum(self.invalid_by_field.values())


def local_format(path: str | Path) -> str:
    """``parquet`` or ``json`` (the ``datasets`` builder) from the file suffix; anything else is an error."""
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".jsonl", ".json"):
        return "json"
    raise ValueError(f"data.path {path}: expected a .parquet, .jsonl or .json file; got suffix {suffix!r}")


def load_local(path: str | Path, split: str = "train"):
    """A local parquet/jsonl file as a ``datasets.Dataset`` (``load_dataset("parquet"|"json", data_files=...)``)."""
    from datasets import load_dataset

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data.path {path} does not exist")
    return load_dataset(local_format(path), data_files=str(path), split=split)


def load_training_dataset(cfg: DataConfig, local_path: str | Path | None = None):
    """The training set as a ``datasets.Dataset`` and a record of where it came from.

    ``local_path`` overrides ``cfg.path`` (the toy world writes its rows to a file and loads them like any local set).
    """
    if local_path is not None or cfg.source == "local":
        path = Path(local_path if local_path is not None else cfg.path)
        dataset = load_local(path)
        return dataset, {"kind": "local", "path": str(path)}
    from datasets import load_dataset

    dataset = load_dataset(cfg.hub_id, split=cfg.hub_split, revision=cfg.hub_revision or None)
    return dataset, {"kind": "hub", "hub_id": cfg.hub_id, "split": cfg.hub_split,
                     "revision": cfg.hub_revision or "latest", "fingerprint": dataset._fingerprint}


def validate_rows(dataset, source_name: str, invalid_rows: str) -> tuple[list[dict], list[int], list[dict], Counter]:
    """Checks every row; ``invalid_rows=error`` raises on the first bad one, ``skip`` collects them."""
    rows: list[dict] = []
    row_ids: list[int] = []
    invalid: list[dict] = []
    by_field: Counter = Counter()
    for index, row in enumerate(dataset):
        try:
            check_row(row, index, source_name)
        except InvalidRowError as error:
            if invalid_rows == "error":
                raise
            by_field[error.field] += 1
            if len(invalid) < MAX_RECORDED_INVALID_ROWS:
                invalid.append({"row": index, "field": error.field, "reason": error.reason})
            continue
        rows.append(row)
        row_ids.append(index)
    return rows, row_ids, invalid, by_field


def load_rows(cfg: DataConfig, local_path: str | Path | None = None) -> LoadedRows:
    """Loads and validates the training set; nothing is dropped without being counted."""
    dataset, source = load_training_dataset(cfg, local_path)
    name = source.get("path") or source["hub_id"]
    rows, row_ids, invalid, by_field = validate_rows(dataset, name, cfg.invalid_rows)
    if not rows:
        raise ValueError(f"{name}: no valid rows (of {len(dataset)}); invalid by field: {dict(by_field)}")
    return LoadedRows(rows=rows, row_ids=row_ids, source=source, num_source_rows=len(dataset),
                      invalid=invalid, invalid_by_field=dict(by_field))
