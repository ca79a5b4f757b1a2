"""Evaluation benchmarks: loaded from the hub, from local JSONL files, or drawn from the toy world's held-out problems.

The data stage writes each as a benchmark file (format and writer: :mod:`common.benchmarks`). Answers that are
integral numbers are normalised to plain integer strings (``142.0`` -> ``142``, ``025`` -> ``25``); everything else is
kept as given (HMMT's LaTeX answers).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from common.config.data import BenchmarkSource, DataConfig
from data.loading import local_format, scan_jsonl

_INTEGER = re.compile(r"^[+-]?\d+(\.0+)?$")


class BenchmarkError(ValueError):
    """A benchmark file or hub set that is missing fields or has the wrong number of problems."""


def normalise_answer(value: Any) -> str:
    """Integral numbers become plain integer strings; any other answer is returned as a stripped string."""
    if isinstance(value, bool):
        raise BenchmarkError(f"answer {value!r} is a boolean")
    if isinstance(value, (int, float)):
        if float(value).is_integer():
            return str(int(value))
        return repr(value)
    text = str(value).strip()
    if _INTEGER.match(text):
        return str(int(float(text)))
    return text


def records_from_rows(name: str, rows, source: BenchmarkSource, where: str) -> list[dict[str, Any]]:
    """``{id, problem, answer, answer_raw}`` records from dataset rows using the configured field names."""
    records = []
    for index, row in enumerate(rows):
        for field in (source.problem_field, source.answer_field) + ((source.id_field,) if source.id_field else ()):
            if row.get(field) is None:
                raise BenchmarkError(f"{where}: row {index} has no field '{field}' "
                                     f"(data.benchmarks.{name}: set problem_field/answer_field/id_field)")
        problem = str(row[source.problem_field])
        if not problem.strip():
            raise BenchmarkError(f"{where}: row {index}: field '{source.problem_field}' is empty")
        records.append({
            "id": str(row[source.id_field]) if source.id_field else f"{name}-{index}",
            "problem": problem,
            "answer": normalise_answer(row[source.answer_field]),
            "answer_raw": str(row[source.answer_field]),
        })
    ids = [record["id"] for record in records]
    if len(set(ids)) != len(ids):
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        raise BenchmarkError(f"{where}: duplicate ids {duplicates[:5]}")
    return records


def luffy_records(name: str, rows, data_source: str, where: str) -> list[dict[str, Any]]:
    """``{id, problem, answer, answer_raw}`` of the rows of a LUFFY/verl-layout file whose ``data_source`` is
    ``data_source``: problem = the prompt's user turn, answer = ``reward_model.ground_truth`` without one outer
    ``$...$`` (OlympiadBench wraps 266 golds in it), id = ``<name>-<extra_info.index>``, each index once."""
    records, seen = [], set()
    for row in rows:
        if row["data_source"] != data_source or row["extra_info"]["index"] in seen:
            continue  # a set repeated for avg@32 (LUFFY's aime, amc: x32) is kept once
        seen.add(row["extra_info"]["index"])
        gold = str(row["reward_model"]["ground_truth"]).strip()
        inner = gold[1:-1].strip() if len(gold) > 2 and gold[0] == gold[-1] == "$" and "$" not in gold[1:-1] else gold
        records.append({"id": f"{name}-{row['extra_info']['index']}", "problem": row["prompt"][-1]["content"],
                        "answer": normalise_answer(inner), "answer_raw": gold})
    if not records:
        raise BenchmarkError(f"{where}: no row has data_source '{data_source}' (data.extra_benchmarks.{name}"
                             ".data_source)")
    return records


def load_benchmark(name: str, source: BenchmarkSource, cfg: DataConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Records of one hub or local benchmark and a provenance record; checks ``expected_count``."""
    from datasets import load_dataset

    if source.path:
        path = Path(source.path)
        if not path.is_file():
            key = f"data.{'extra_benchmarks' if name in cfg.extra_benchmarks else 'benchmarks'}.{name}.path"
            raise BenchmarkError(f"{key}: {path} does not exist; point it at the file")
        dataset = load_dataset(local_format(path), data_files=str(path), split="train")
        provenance = {"kind": "local", "path": str(path), **({"data_source": source.data_source}
                                                             if source.data_source else {})}
        records = (luffy_records(name, dataset, source.data_source, str(path)) if source.data_source
                   else records_from_rows(name, dataset, source, str(path)))
        check_count(name, len(records), source.expected_count, str(path))
        return records, provenance
    if cfg.benchmark_source == "local":
        path = Path(cfg.benchmark_dir) / source.file
        if not path.is_file():
            raise BenchmarkError(f"data.benchmarks.{name}: {path} does not exist "
                                 f"(data.benchmark_dir={cfg.benchmark_dir}, file={source.file})")
        not_utf8 = scan_jsonl(path)  # load_dataset stops at a bad byte without naming the file or the row
        if not_utf8:
            raise BenchmarkError(f"{next(iter(not_utf8.values()))}; fix: save {path} as UTF-8 (e.g. iconv -f latin1 "
                                 "-t utf-8); a benchmark is only evaluated whole, so no row is skipped")
        dataset = load_dataset("json", data_files=str(path), split="train")
        where, provenance = str(path), {"kind": "local", "path": str(path)}
    else:
        dataset = load_dataset(source.hub_id, source.hub_config or None, split=source.hub_split,
                               revision=source.hub_revision or None)
        where = f"{source.hub_id}[{source.hub_split}]"
        provenance = {"kind": "hub", "hub_id": source.hub_id, "split": source.hub_split,
                      "config": source.hub_config, "revision": source.hub_revision or "latest",
                      "fingerprint": dataset._fingerprint}
    records = records_from_rows(name, dataset, source, where)
    check_count(name, len(records), source.expected_count, where)
    return records, provenance


def check_count(name: str, count: int, expected: int, where: str) -> None:
    if expected and count != expected:
        raise BenchmarkError(f"{where}: {count} problems, but data.benchmarks.{name}.expected_count is {expected}")

