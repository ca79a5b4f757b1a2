"""Benchmarks through the local loader (the real files in ../shared/data/benchmarks, read by path)."""
from __future__ import annotations

import pytest

from data.benchmarks import BenchmarkError, load_benchmark
from common.benchmarks import read_benchmark, write_benchmark
from common.config import compose

LUFFY_PROMPT_SHA = "a8747f1674d341836ab8fae3c29263fee4dd555f07259cdbc6dadf4104ea8926"


@pytest.fixture(scope="module")
def local_cfg(shared_data):
    return compose(["profile=paper", "experiment=table1", "data=openr1_local", "data.path=unused.parquet",
                    f"data.benchmark_dir={shared_data / 'benchmarks'}"]).data


@pytest.mark.parametrize("name, count, first_id, first_answer", [
    ("aime24", 30, "aime24-I-01", "204"), ("aime25", 30, "aime25-I-01", "70"),
    ("amc", 83, None, None), ("hmmt25", 30, "hmmt25-feb-01", None),
])
def test_shared_benchmarks_load_with_expected_counts(local_cfg, name, count, first_id, first_answer):
    records, provenance = load_benchmark(name, local_cfg.benchmarks[name], local_cfg)
    assert len(records) == count == local_cfg.benchmarks[name].expected_count
    assert provenance["kind"] == "local"
    assert len({r["id"] for r in records}) == count
    if first_id:
        assert records[0]["id"] == first_id
    if first_answer:
        assert records[0]["answer"] == first_answer


def test_wrong_expected_count_names_the_key(local_cfg):
    source = local_cfg.benchmarks["aime24"]
    source.expected_count = 31
    with pytest.raises(BenchmarkError, match=r"30 problems, but data.benchmarks.aime24.expected_count is 31"):
        load_benchmark("aime24", source, local_cfg)


def test_written_benchmark_carries_the_prompt(tmp_path, shared_data):
    system = (shared_data / "prompts" / "luffy_system_prompt.txt").read_text(encoding="utf-8")
    write_benchmark(tmp_path / "b.jsonl", [{"id": "a", "problem": "P?", "answer": "1", "answer_raw": "01"}], system)
    (line,) = read_benchmark(tmp_path / "b.jsonl")
    assert line["prompt"] == [{"role": "system", "content": system}, {"role": "user", "content": "P?"}]
    assert len(system) == 762
