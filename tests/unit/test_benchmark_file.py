"""The benchmark hand-off (common.benchmarks): what the data stage writes at common.paths.benchmark_file, evaluation
reads; a bad file is named with its line and key."""
from __future__ import annotations

import json

import pytest

from common.benchmarks import read_benchmark, write_benchmark
from common.manifest import StageInputError
from common.paths import benchmark_file

PROMPT = [{"role": "user", "content": "1+1?"}]


def test_the_writer_and_the_reader_agree_on_the_file(tmp_path):
    path = tmp_path / benchmark_file("toy_add")
    assert path == tmp_path / "benchmarks" / "toy_add.jsonl"
    write_benchmark(path, [{"id": "toy_add-000", "problem": "1+1?", "answer": "2", "answer_raw": "2.0"}], "Be brief.")
    assert read_benchmark(path) == [{"id": "toy_add-000", "problem": "1+1?", "answer": "2", "answer_raw": "2.0",
                                     "prompt": [{"role": "system", "content": "Be brief."}, *PROMPT]}]


def test_ids_and_answers_are_read_as_strings_and_blank_lines_skipped(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps({"id": 7, "answer": 25, "prompt": PROMPT}) + "\n\n", encoding="utf-8")
    assert read_benchmark(path) == [{"id": "7", "answer": "25", "prompt": PROMPT}]


@pytest.mark.parametrize("lines, message", [
    (["{"], r"b.jsonl:1: not valid JSON"),
    ([{"id": "a", "answer": " ", "prompt": PROMPT}], r"b.jsonl:1: 'answer' must be a non-empty string; got ' '"),
    ([{"answer": "1", "prompt": PROMPT}], r"b.jsonl:1: 'id' must be a non-empty string; got None"),
    ([{"id": "a", "answer": "1", "prompt": [{"role": "user"}]}], r"b.jsonl:1: 'prompt' must be a non-empty list"),
    ([{"id": "a", "answer": "1", "prompt": PROMPT}, {"id": "a", "answer": "2", "prompt": PROMPT}],
     r"b.jsonl:2: duplicate id 'a'"),
    ([], r"b.jsonl has no rows"),
])
def test_a_bad_file_is_named_with_its_line_and_key(tmp_path, lines, message):
    path = tmp_path / "b.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines),
                    encoding="utf-8")
    with pytest.raises(StageInputError, match=message):
        read_benchmark(path)


def test_a_missing_file_says_to_run_the_data_stage(tmp_path):
    with pytest.raises(StageInputError, match="does not exist; run the data stage first"):
        read_benchmark(tmp_path / benchmark_file("aime24"))
