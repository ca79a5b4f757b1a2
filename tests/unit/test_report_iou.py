"""IoU(M_H, M_KL) summary from a hand-written SFT metrics log."""
from __future__ import annotations

import json

import pytest

from report.analyses import AnalysisInputError
from report.analyses.iou import iou_markdown, iou_series

LOG = [
    # step 1: M_KL empty (π_θ = π_ref) → left out
    {"step": 1, "loss": 2.0, "stats/iou": 0.0, "stats/num_T": 50, "stats/num_M_H": 10, "stats/num_M_KL": 0,
     "stats/num_M": 10},
    {"step": 2, "stats/iou": 0.25, "stats/num_T": 50, "stats/num_M_H": 10, "stats/num_M_KL": 10, "stats/num_M": 16},
    {"step": 3, "stats/iou": 0.5, "stats/num_T": 40, "stats/num_M_H": 8, "stats/num_M_KL": 8, "stats/num_M": 10},
    {"step": 4, "stats/iou": 0.9, "stats/num_T": 40, "stats/num_M_H": 8, "stats/num_M_KL": 8, "stats/num_M": 9},
]


def _write(tmp_path, records):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_min_avg_max_over_steps_with_both_sets(tmp_path):
    series = iou_series(_write(tmp_path, LOG))
    assert series.steps == [2, 3, 4]
    assert series.summary() == {"steps": 3, "skipped_steps": 1, "min": 0.25, "avg": pytest.approx(0.55), "max": 0.9}
    assert series.fractions == {"M_H": [0.2, 0.2, 0.2], "M_KL": [0.2, 0.2, 0.2], "M": [0.32, 0.25, 0.225]}
    assert iou_markdown({"EKSFT": series.summary()}).splitlines()[2] == "| EKSFT | 3 | 0.25 | 0.55 | 0.90 |"


def test_a_step_logged_twice_keeps_its_last_line(tmp_path):
    series = iou_series(_write(tmp_path, [*LOG, {**LOG[3], "stats/iou": 0.3}]))
    assert series.iou == [0.25, 0.5, 0.3]


def test_runs_without_iou_and_bad_logs(tmp_path):
    assert iou_series(_write(tmp_path, [{"step": 1, "loss": 1.0}])) is None
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "stats/iou": 0.5}\n{"step": 2, "stats/iou"\n')
    with pytest.raises(AnalysisInputError, match="metrics.jsonl"):
        iou_series(path)
