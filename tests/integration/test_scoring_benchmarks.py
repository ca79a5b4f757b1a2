"""eval.scoring on every gold answer of the real benchmarks (../shared/data/benchmarks, read by path)."""
from __future__ import annotations

import json

import pytest

from eval.scoring import verify

BENCHMARKS = ("aime24", "aime25", "amc", "hmmt25")


def _obviously_different(gold: str) -> str:
    return str(int(gold) + 1) if gold.lstrip("-").isdigit() else "987654"


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_every_benchmark_gold_verifies_against_itself_and_not_against_another_number(shared_data, benchmark):
    rows = [json.loads(line) for line in (shared_data / "benchmarks" / f"{benchmark}.jsonl").read_text().splitlines()]
    wrong_self = [r["id"] for r in rows if verify(f"The answer is \\boxed{{{r['answer']}}}.", r["answer"]) != 1.0]
    wrong_other = [r["id"] for r in rows
                   if verify(f"\\boxed{{{_obviously_different(r['answer'])}}}", r["answer"]) != 0.0]
    assert not wrong_self and not wrong_other
