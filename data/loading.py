"""Loading the training set (hub id or local parquet/jsonl, both through ``datasets.load_dataset``) with row checks.

Rows whose strings are not valid UTF-8 are invalid rows like any other (named by file, row and field; skipped and
counted under ``data.invalid_rows=skip``): a JSONL file is scanned line by line before loading, since
``load_dataset("json")`` stops at the first bad byte without naming a line, and the rows that decode are loaded from
a copy without the bad lines; parquet strings are decoded row by row while iterating. Duplicate ids
(``extra_info.index``) and duplicate problems (:func:`data.schema.problem_key`) are counted
(``data.duplicates=count``) or refused (``refuse``).
"""
from __future__ import annotations

import json
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from data.row_formats import to_luffy_row
from data.schema import InvalidRowError, check_row, problem_key, problem_text
from common.config.data import DataConfig

MAX_RECORDED_INVALID_ROWS = 20
MAX_RECORDED_DUPLICATE_GROUPS = 20
_NOT_UTF8 = "is not valid UTF-8"


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
    duplicates: dict[str, Any] = field(default_factory=dict)
    """:func:`count_duplicates` of the valid rows, plus the ``data.duplicates`` policy."""

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


def load_local(path: str | Path, split: str = "train", invalid_rows: str = "error"):
    """A local parquet/jsonl file as a ``datasets.Dataset`` (``load_dataset("parquet"|"json", data_files=...)``), and the
    JSONL rows left out of it because they are not UTF-8 (``invalid_rows=error`` raises on the first of those)."""
    from datasets import load_dataset

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data.path {path} does not exist")
    builder = local_format(path)
    not_utf8 = scan_jsonl(path) if builder == "json" else {}
    if not not_utf8:
        return load_dataset(builder, data_files=str(path), split=split), []
    if invalid_rows == "error":
        raise next(iter(not_utf8.values()))
    with tempfile.TemporaryDirectory() as scratch:
        readable = Path(scratch) / path.name
        with open(path, "rb") as source, open(readable, "wb") as copy:
            copy.writelines(line for number, line in enumerate(source, start=1) if number not in not_utf8)
        dataset = load_dataset(builder, data_files=str(readable), split=split, cache_dir=scratch, keep_in_memory=True)
    return dataset, list(not_utf8.values())


def scan_jsonl(path: Path) -> dict[int, InvalidRowError]:
    """The rows of a JSONL file that are not valid UTF-8, by line number; rows are the non-blank lines (as
    ``load_dataset`` reads them), so row and line numbers differ after a blank line."""
    found: dict[int, InvalidRowError] = {}
    row = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                found[number] = _jsonl_error(path, row, number, line, error)
            row += 1
    return found


def _jsonl_error(path: Path, row: int, line_number: int, line: bytes, error: UnicodeDecodeError) -> InvalidRowError:
    try:
        where = _undecodable_field(json.loads(line.decode("utf-8", errors="surrogateescape")), "") or "(line)"
    except ValueError:
        where = "(line)"
    return InvalidRowError(str(path), row, where, f"{_NOT_UTF8} (line {line_number}, {_bad_bytes(error)})")


def _bad_bytes(error: UnicodeDecodeError) -> str:
    return f"byte {error.start}: {error.object[max(0, error.start - 20):error.end + 20]!r}"


def _undecodable_field(value: Any, path: str) -> str | None:
    """Path (``prompt[1].content``) of the first string in ``value`` that holds an undecodable byte (a lone surrogate
    from ``surrogateescape``), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _undecodable_field(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key)
        if found:
            return found
    return None


def _decoded_rows(dataset, source: str) -> Iterator[dict | InvalidRowError]:
    """The dataset's rows in order; a row with a string that is not UTF-8 (parquet does not check) comes as an
    :class:`InvalidRowError` naming its column. Such a row ends an iteration, which then resumes after it."""
    position = 0
    while position < len(dataset):
        rest = dataset.select(range(position, len(dataset))) if position else dataset
        try:
            for row in rest:
                yield row
                position += 1
            return
        except UnicodeDecodeError:
            pass
        while position < len(dataset):  # one row at a time to the one that fails (iterating may decode several at once)
            try:
                row = dataset[position]
            except UnicodeDecodeError as error:
                column = next((name for name in dataset.column_names if _fails_to_decode(dataset, name, position)),
                              "(row)")
                yield InvalidRowError(source, position, column, f"{_NOT_UTF8} ({_bad_bytes(error)})")
                position += 1
                break
            yield row
            position += 1


def _fails_to_decode(dataset, column: str, position: int) -> bool:
    try:
        dataset.select_columns([column])[position]
    except UnicodeDecodeError:
        return True
    return False


def source_rows(dataset, source: str, not_utf8: Iterable[InvalidRowError] = ()) -> Iterator[tuple[int, Any]]:
    """(index in the source, row or the :class:`InvalidRowError` that makes it unreadable) for every source row, in
    order; the ``not_utf8`` rows are not in ``dataset``."""
    missing = {error.index: error for error in not_utf8}
    decoded = _decoded_rows(dataset, source)
    for index in range(len(dataset) + len(missing)):
        yield index, missing[index] if index in missing else next(decoded)


def load_training_dataset(cfg: DataConfig, local_path: str | Path | None = None):
    """The training set as a ``datasets.Dataset``, a record of where it came from, and the rows left out of it as not
    UTF-8 (local JSONL under ``invalid_rows=skip``).

    ``local_path`` overrides ``cfg.path`` (the toy world writes its rows to a file and loads them like any local set).
    """
    if local_path is not None or cfg.source == "local":
        path = Path(local_path if local_path is not None else cfg.path)
        dataset, not_utf8 = load_local(path, invalid_rows=cfg.invalid_rows)
        return dataset, {"kind": "local", "path": str(path)}, not_utf8
    from datasets import load_dataset

    dataset = load_dataset(cfg.hub_id, split=cfg.hub_split, revision=cfg.hub_revision or None)
    return dataset, {"kind": "hub", "hub_id": cfg.hub_id, "split": cfg.hub_split,
                     "revision": cfg.hub_revision or "latest", "fingerprint": dataset._fingerprint}, []


def validate_rows(dataset, source_name: str, invalid_rows: str, not_utf8: Iterable[InvalidRowError] = (),
                  row_format: str = "luffy") -> tuple[list[dict], list[int], list[dict], Counter]:
    """Converts every row from ``row_format`` (:func:`data.row_formats.to_luffy_row`) and checks it;
    ``invalid_rows=error`` raises on the first bad one, ``skip`` collects them."""
    rows: list[dict] = []
    row_ids: list[int] = []
    invalid: list[dict] = []
    by_field: Counter = Counter()
    for index, row in source_rows(dataset, source_name, not_utf8):
        try:
            if isinstance(row, InvalidRowError):
                raise row
            row = to_luffy_row(row, index, source_name, row_format)
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


def count_duplicates(ids: Iterable[Any], problems: Iterable[str], row_ids: Iterable[int]) -> dict[str, dict]:
    """Rows sharing an id and rows sharing a problem (:func:`data.schema.problem_key` of its text), the rows given
    as parallel ``ids``, problem texts and ``row_ids``.

    For each kind: ``duplicate_rows`` = sum over groups of (size - 1), ``groups`` = groups of two or more rows, and the
    first groups' row ids (problems also with the text).
    """
    by_id: dict[Any, list[int]] = defaultdict(list)
    by_problem: dict[str, list[int]] = defaultdict(list)
    text_of: dict[str, str] = {}
    for row_id_value, text, row_id in zip(ids, problems, row_ids, strict=True):
        by_id[row_id_value].append(row_id)
        key = problem_key(text)
        by_problem[key].append(row_id)
        text_of.setdefault(key, text)

    def summary(groups: dict, describe) -> dict:
        repeated = [(key, ids) for key, ids in groups.items() if len(ids) > 1]
        return {"duplicate_rows": sum(len(ids) - 1 for _, ids in repeated), "groups": len(repeated),
                "first": [describe(key, ids) for key, ids in repeated[:MAX_RECORDED_DUPLICATE_GROUPS]]}

    return {"ids": summary(by_id, lambda key, ids: {"id": key, "rows": ids}),
            "problems": summary(by_problem, lambda key, ids: {"rows": ids, "problem": text_of[key][:80]})}


def refuse_duplicates(source_name: str, duplicates: dict[str, dict]) -> None:
    """Raises naming the repeated ids and problems with their rows, if there are any (``data.duplicates=refuse``)."""
    ids, problems = duplicates["ids"], duplicates["problems"]
    found = []
    if ids["duplicate_rows"]:
        groups = "; ".join(f"extra_info.index {group['id']}: rows {_listed(group['rows'])}" for group in ids["first"])
        found.append(f"{ids['duplicate_rows']} rows repeat an id ({groups})")
    if problems["duplicate_rows"]:
        groups = "; ".join(f"rows {_listed(group['rows'])}: {group['problem']!r}" for group in problems["first"])
        found.append(f"{problems['duplicate_rows']} rows repeat a problem ({groups})")
    if found:
        raise ValueError(f"{source_name}: data.duplicates=refuse, but {' and '.join(found)}; "
                         "remove the duplicates or set data.duplicates=count")


def _listed(row_ids: list[int]) -> str:
    return ", ".join(str(row_id) for row_id in row_ids)


def load_rows(cfg: DataConfig, local_path: str | Path | None = None) -> LoadedRows:
    """Loads and validates the training set; nothing is dropped without being counted."""
    dataset, source, not_utf8 = load_training_dataset(cfg, local_path)
    name = source.get("path") or source["hub_id"]
    rows, row_ids, invalid, by_field = validate_rows(dataset, name, cfg.invalid_rows, not_utf8, cfg.row_format)
    num_source_rows = len(dataset) + len(not_utf8)
    if not rows:
        raise ValueError(f"{name}: no valid rows (of {num_source_rows}); invalid by field: {dict(by_field)}")
    duplicates = count_duplicates([row["extra_info"]["index"] for row in rows], map(problem_text, rows), row_ids)
    if cfg.duplicates == "refuse":
        refuse_duplicates(name, duplicates)
    return LoadedRows(rows=rows, row_ids=row_ids, source=source, num_source_rows=num_source_rows,
                      invalid=invalid, invalid_by_field=dict(by_field),
                      duplicates={"policy": cfg.duplicates, **duplicates})
