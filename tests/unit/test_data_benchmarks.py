"""Benchmark answers normalised to the form the scorer compares (loading the real files: tests/integration/test_data_benchmarks_local.py)."""
from __future__ import annotations

import json

import pytest

from common.benchmarks import read_benchmark, write_benchmark
from common.config import ConfigError, compose
from common.config.data import BenchmarkSource
from common.manifest import StageInputError
from data.benchmarks import BenchmarkError, load_benchmark, normalise_answer


@pytest.mark.parametrize("raw, expected", [
    ("025", "25"), ("142.0", "142"), (142.0, "142"), (-4, "-4"), ("336^\\circ", "336^\\circ"),
    (" \\frac{1}{576} ", "\\frac{1}{576}"), (2.5, "2.5"),
])
def test_answer_normalisation(raw, expected):
    assert normalise_answer(raw) == expected


def _benchmark_with_a_bad_byte(path, bad_line: int = 3):
    lines = [json.dumps({"id": f"p{i}", "problem": f"What is {i} + 1?", "answer": str(i + 1)}).encode()
             for i in range(1, 5)]
    lines[bad_line - 1] = lines[bad_line - 1].replace(b"What", b"Wh\xe9t")  # latin-1 'é': not UTF-8
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_a_local_benchmark_that_is_not_utf8_is_named_with_its_row_and_byte(tmp_path):
    # Issue 32.4: a benchmark JSONL with a non-UTF-8 byte raised UnicodeDecodeError inside `datasets`, naming neither
    # the file nor the row (a training file with the same byte was named, row and byte).
    _benchmark_with_a_bad_byte(tmp_path / "aime24.jsonl")
    cfg = compose(["data=openr1_local", "data.path=unused.parquet", f"data.benchmark_dir={tmp_path}"]).data
    with pytest.raises(BenchmarkError) as error:
        load_benchmark("aime24", BenchmarkSource(file="aime24.jsonl"), cfg)
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'aime24.jsonl'}: row 2: field 'problem' is not valid UTF-8 (line 3, byte ")
    assert "\\xe9" in message and "fix:" in message


def test_a_benchmark_handoff_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    path = tmp_path / "benchmarks" / "aime24.jsonl"
    write_benchmark(path, [{"id": "a", "problem": "What?", "answer": "1", "answer_raw": "1"},
                           {"id": "b", "problem": "What?", "answer": "2", "answer_raw": "2"}], None)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[1].replace(b"What?", b"Wh\xe9t?"))
    with pytest.raises(StageInputError, match=rf"^{path}:2: not valid UTF-8 \(byte "):
        read_benchmark(path)


def _luffy_row(data_source: str, index: int, gold: str) -> dict:
    return {"data_source": data_source, "ability": "math",
            "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": f"{data_source} {index}?"}],
            "reward_model": {"ground_truth": gold, "style": "rule"}, "extra_info": {"index": index, "split": "default"}}


def test_a_benchmark_read_from_a_luffy_file_by_its_data_source(tmp_path):
    """LUFFY's valid.all.parquet layout (issue 43.4): filtered on data_source, a set repeated x32 kept once, one outer
    $...$ taken off the gold (answer_raw keeps it), ids <name>-<extra_info.index>."""
    from datasets import Dataset

    rows = [_luffy_row("aime", 0, "7"), _luffy_row("olympiad_bench", 0, "$\\frac{1}{2}$"),
            _luffy_row("olympiad_bench", 1, "$x$ and $y$"), _luffy_row("aime", 0, "7"),
            _luffy_row("olympiad_bench", 2, "042")]
    path = tmp_path / "valid.parquet"
    Dataset.from_list(rows).to_parquet(str(path))
    cfg = compose(["experiment=table1", "profile=paper", f"data.extra_benchmarks.olympiad.path={path}",
                   "data.extra_benchmarks.olympiad.expected_count=3", f"data.extra_benchmarks.math500.path={path}",
                   "data.extra_benchmarks.math500.data_source=aime", "data.extra_benchmarks.math500.expected_count=1"])
    records, provenance = load_benchmark("olympiad", cfg.data.extra_benchmarks["olympiad"], cfg.data)
    assert provenance == {"kind": "local", "path": str(path), "data_source": "olympiad_bench"}
    assert [(r["id"], r["problem"], r["answer"], r["answer_raw"]) for r in records] == [
        ("olympiad-0", "olympiad_bench 0?", "\\frac{1}{2}", "$\\frac{1}{2}$"),
        ("olympiad-1", "olympiad_bench 1?", "$x$ and $y$", "$x$ and $y$"),
        ("olympiad-2", "olympiad_bench 2?", "42", "042")]
    assert [r["id"] for r in load_benchmark("math500", cfg.data.extra_benchmarks["math500"], cfg.data)[0]] == [
        "math500-0"]


def test_a_data_source_filter_needs_a_path():
    with pytest.raises(ConfigError, match=r"data.extra_benchmarks.minerva.data_source filters the rows of "
                                          r"data.extra_benchmarks.minerva.path"):
        compose(["experiment=table1", "profile=paper", "data.extra_benchmarks.minerva.path=''"])
