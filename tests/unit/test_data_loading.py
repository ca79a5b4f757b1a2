"""Loading local training files: undecodable rows are named (file, row, line, field) and skippable; duplicates counted."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from data.loading import load_rows
from data.schema import InvalidRowError
from common.config import ConfigError, compose
from common.config.data import DataConfig

GOOD = {
    "data_source": "",
    "prompt": [{"role": "system", "content": "Think."}, {"role": "user", "content": "What is 0 + 1?"}],
    "target": [{"role": "assistant", "content": "<think>\n0 + 1 = 1.</think>\n\\boxed{1}"}],
    "ability": "math",
    "reward_model": {"ground_truth": "1", "style": "rule"},
    "extra_info": {"index": 0, "split": "default"},
}
BAD_BYTES = b"\xff\xfe"


def make_row(index: int, problem: str | None = None) -> dict:
    row = copy.deepcopy(GOOD)
    row["prompt"][1]["content"] = problem if problem is not None else f"What is {index} + 1?"
    row["extra_info"]["index"] = index
    return row


def local_config(path: Path, **overrides) -> DataConfig:
    return DataConfig(source="local", path=str(path), **overrides)


def write_jsonl_with_bad_bytes(path: Path, num_rows: int, bad_row: int, blank_line_before: bool = False) -> None:
    """``num_rows`` rows; row ``bad_row``'s problem text holds bytes that are not UTF-8."""
    lines = [json.dumps(make_row(i)).encode() for i in range(num_rows)]
    lines[bad_row] = lines[bad_row].replace(f"What is {bad_row} ".encode(), b"What is " + BAD_BYTES + b" ")
    if blank_line_before:
        lines.insert(bad_row, b"")
    path.write_bytes(b"\n".join(lines) + b"\n")


def write_parquet_with_bad_bytes(path: Path, num_rows: int, bad_row: int) -> None:
    """A parquet file whose ``prompt[1].content`` string of row ``bad_row`` is not UTF-8 (pyarrow does not check)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([make_row(i) for i in range(num_rows)])
    contents = [content.encode() for row in table.column("prompt").to_pylist() for content in
                (message["content"] for message in row)]
    contents[2 * bad_row + 1] = b"What is " + BAD_BYTES + b" + 1?"
    binary = pa.array(contents, pa.binary())
    content = pa.Array.from_buffers(pa.string(), len(binary), binary.buffers())
    prompt = table.column("prompt").combine_chunks()
    messages = pa.StructArray.from_arrays([prompt.values.field("role"), content], names=["role", "content"])
    table = table.set_column(table.schema.get_field_index("prompt"), "prompt",
                             pa.ListArray.from_arrays(prompt.offsets, messages))
    pq.write_table(table, path)


def test_jsonl_row_that_is_not_utf8_names_file_row_line_and_field(tmp_path):
    path = tmp_path / "train.jsonl"
    write_jsonl_with_bad_bytes(path, num_rows=5, bad_row=2, blank_line_before=True)
    with pytest.raises(InvalidRowError) as error:
        load_rows(local_config(path))
    message = str(error.value)
    assert message.startswith(f"{path}: row 2: field 'prompt[1].content' is not valid UTF-8")
    assert "line 4" in message  # the blank line is not a row, but it is a line
    assert (error.value.index, error.value.field) == (2, "prompt[1].content")


def test_jsonl_row_that_is_not_utf8_is_skipped_and_counted(tmp_path):
    path = tmp_path / "train.jsonl"
    write_jsonl_with_bad_bytes(path, num_rows=5, bad_row=2)
    loaded = load_rows(local_config(path, invalid_rows="skip"))
    assert loaded.row_ids == [0, 1, 3, 4] and loaded.num_source_rows == 5
    assert [row["extra_info"]["index"] for row in loaded.rows] == [0, 1, 3, 4]
    assert loaded.invalid_by_field == {"prompt[1].content": 1}
    assert [entry["row"] for entry in loaded.invalid] == [2]
    assert "line 3" in loaded.invalid[0]["reason"]


def test_parquet_row_that_is_not_utf8_names_file_row_and_column(tmp_path):
    path = tmp_path / "train.parquet"
    write_parquet_with_bad_bytes(path, num_rows=5, bad_row=3)
    with pytest.raises(InvalidRowError) as error:
        load_rows(local_config(path))
    assert str(error.value).startswith(f"{path}: row 3: field 'prompt' is not valid UTF-8")


def test_parquet_row_that_is_not_utf8_is_skipped_and_counted(tmp_path):
    path = tmp_path / "train.parquet"
    write_parquet_with_bad_bytes(path, num_rows=5, bad_row=1)
    loaded = load_rows(local_config(path, invalid_rows="skip"))
    assert loaded.row_ids == [0, 2, 3, 4] and loaded.num_source_rows == 5
    assert [row["extra_info"]["index"] for row in loaded.rows] == [0, 2, 3, 4]
    assert loaded.invalid_by_field == {"prompt": 1}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def rows_with_duplicates() -> list[dict]:
    """Rows 0-5: row 3 repeats row 1's id; rows 2 and 5 ask row 0's problem (case and spacing differ)."""
    rows = [make_row(i) for i in range(6)]
    rows[3]["extra_info"]["index"] = 1
    rows[2]["prompt"][1]["content"] = "what  is 0 + 1?"
    rows[5]["prompt"][1]["content"] = "WHAT IS 0 + 1?"
    return rows


def test_duplicate_ids_and_problems_are_counted(tmp_path):
    path = tmp_path / "train.jsonl"
    write_jsonl(path, rows_with_duplicates())
    loaded = load_rows(local_config(path))
    assert loaded.duplicates["ids"] == {"duplicate_rows": 1, "groups": 1, "first": [{"id": 1, "rows": [1, 3]}]}
    problems = loaded.duplicates["problems"]
    assert (problems["duplicate_rows"], problems["groups"]) == (2, 1)
    assert problems["first"][0]["rows"] == [0, 2, 5]
    assert loaded.duplicates["policy"] == "count" and len(loaded.rows) == 6


def test_no_duplicates_counts_zero(tmp_path):
    path = tmp_path / "train.jsonl"
    write_jsonl(path, [make_row(i) for i in range(4)])
    duplicates = load_rows(local_config(path)).duplicates
    assert duplicates["ids"]["duplicate_rows"] == 0 and duplicates["problems"]["duplicate_rows"] == 0


def test_duplicates_refused_under_the_strict_option(tmp_path):
    path = tmp_path / "train.jsonl"
    write_jsonl(path, rows_with_duplicates())
    with pytest.raises(ValueError) as error:
        load_rows(local_config(path, duplicates="refuse"))
    message = str(error.value)
    assert message.startswith(f"{path}: data.duplicates=refuse")
    assert "extra_info.index 1: rows 1, 3" in message and "rows 0, 2, 5" in message


def test_duplicates_option_is_validated():
    with pytest.raises(ConfigError, match="data.duplicates"):
        compose(["experiment=demo", "profile=toy", "data.duplicates=drop"])


def test_parquet_rows_that_are_not_utf8_are_all_found_and_the_rest_kept(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_parquet_with_bad_bytes(first, num_rows=6, bad_row=1)
    write_parquet_with_bad_bytes(second, num_rows=6, bad_row=4)
    both = tmp_path / "train.parquet"
    pq.write_table(pa.concat_tables([pq.read_table(first), pq.read_table(second)]), both)
    loaded = load_rows(local_config(both, invalid_rows="skip"))
    assert [entry["row"] for entry in loaded.invalid] == [1, 10]
    assert loaded.row_ids == [0, 2, 3, 4, 5, 6, 7, 8, 9, 11] and loaded.num_source_rows == 12
