"""The golden pipeline with 2 threads gives the numbers recorded with 1 (tests/integration/test_golden_numbers.py
runs the 1-thread case in the default suite; this one costs another minute of both cores, so it lives here)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from golden_pipeline import check_against_record  # noqa: E402


@pytest.mark.e2e
def test_the_tiny_pipeline_gives_the_recorded_numbers_with_2_threads(tmp_path):
    failures = check_against_record(tmp_path, threads=2)
    assert not failures, "\n".join(failures)
