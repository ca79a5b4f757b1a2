"""The benchmark hand-off: the data stage writes one JSONL file per benchmark (at :func:`common.paths.benchmark_file`
in its run folder) with :func:`write_benchmark`, evaluation reads it back with :func:`read_benchmark`. One problem per
line::

    {"id": str, "problem": str, "answer": str, "answer_raw": str, "prompt": [system?, user]}

``prompt`` is what evaluation samples from (chat messages; the system turn is ``data.system_prompt_path`` or the
training rows' own system prompt).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.manifest import StageInputError


def benchmark_prompt(problem: str, system_prompt: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": problem}]


def write_benchmark(path: Path, records: list[dict[str, Any]], system_prompt: str | None) -> None:
    """``records`` (``id``, ``problem``, ``answer``, ``answer_raw``) one per line, each with its chat ``prompt``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            line = dict(record, prompt=benchmark_prompt(record["problem"], system_prompt))
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")


def read_benchmark(path: Path) -> list[dict[str, Any]]:
    """Rows of a data-stage benchmark file (``id``, ``answer``, ``prompt`` chat messages, ids and answers as strings);
    errors name the file, line and key."""
    if not path.is_file():
        raise StageInputError(f"benchmark file {path} does not exist; run the data stage first")
    rows, seen = [], set()
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise StageInputError(f"{where}: not valid UTF-8 (byte {exc.start}: "
                                      f"{raw[max(0, exc.start - 20):exc.end + 20]!r}); re-run the data stage") from exc
            except json.JSONDecodeError as exc:
                raise StageInputError(f"{where}: not valid JSON ({exc})") from exc
            for key in ("id", "answer"):
                if not isinstance(row.get(key), (str, int)) or str(row[key]).strip() == "":
                    raise StageInputError(f"{where}: '{key}' must be a non-empty string; got {row.get(key)!r}")
            prompt = row.get("prompt")
            if not (isinstance(prompt, list) and prompt and all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in prompt)):
                raise StageInputError(f"{where}: 'prompt' must be a non-empty list of {{role, content}} messages")
            row["id"], row["answer"] = str(row["id"]), str(row["answer"])
            if row["id"] in seen:
                raise StageInputError(f"{where}: duplicate id {row['id']!r}")
            seen.add(row["id"])
            rows.append(row)
    if not rows:
        raise StageInputError(f"benchmark file {path} has no rows")
    return rows


def system_prompt_of(path: Path) -> str | None:
    """The system turn of the first problem of a benchmark file (None: its prompts have none): the data run writes
    every benchmark of a run with the same one."""
    first = read_benchmark(path)[0]["prompt"][0]
    return first["content"] if first["role"] == "system" else None
