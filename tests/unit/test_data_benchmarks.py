"""Benchmark answers normalised to the form the scorer compares (loading the real files: tests/integration/test_data_benchmarks_local.py)."""
from __future__ import annotations

import pytest

from data.benchmarks import normalise_answer


@pytest.mark.parametrize("raw, expected", [
    ("025", "25"), ("142.0", "142"), (142.0, "142"), (-4, "-4"), ("336^\\circ", "336^\\circ"),
    (" \\frac{1}{576} ", "\\frac{1}{576}"), (2.5, "2.5"),
])
def test_answer_normalisation(raw, expected):
    assert normalise_answer(raw) == expected
