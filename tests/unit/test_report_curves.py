"""Training-curve series read from metrics.jsonl records: the keys the SFT trainer and verl write."""
from __future__ import annotations

import json

from report.analyses import curves, method_colour

from common.paths import RL_DISCARDED_GROUPS
from report.analyses.curves import RL_PANELS, SFT_PANELS, logged_panels, plot_curves, read_runs, rl_panels, series

SFT_LOG = [
    {"step": 1, "loss": 2.0, "stats/ce": 1.5, "stats/entropy_mean_M": 3.0, "stats/entropy_mean_rest": 1.0,
     "stats/kl_mean_M": 0.0, "stats/kl_mean_rest": 0.0, "stats/num_M": 8, "stats/num_T": 40},
    {"step": 2, "loss": 1.0, "stats/ce": 0.9, "stats/entropy_mean_M": 2.0, "stats/entropy_mean_rest": 0.5,
     "stats/kl_mean_M": 0.2, "stats/kl_mean_rest": 0.1, "stats/num_M": 10, "stats/num_T": 40},
    {"step": 2, "loss": 0.5, "stats/num_M": 12, "stats/num_T": 40},  # a resumed run re-logs step 2: the last wins
]
RL_LOG = [
    {"step": 0, "val-core/toy/acc/mean@1": 0.25, "timing_s/testing": 4.0},
    {"step": 1, "critic/score/mean": -0.5, "response_length/mean": 50.0, "actor/entropy": 1.2, "timing_s/step": 10.0},
    {"step": 2, "critic/score/mean": 0.0, "response_length/mean": 40.0, "actor/entropy": 1.0, "timing_s/step": 9.0,
     "val-core/toy/acc/mean@1": 0.5, "val-core/other/acc/mean@1": 0.7, "val-core/toy/reward/mean@1": 9.0},
]


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _panel(panels, title_start):
    return next(panel for panel in panels if panel.title.startswith(title_start))


def test_sft_series(tmp_path):
    runs = read_runs({"EKSFT": {0: _write(tmp_path / "sft.jsonl", SFT_LOG)}, "gone": {0: tmp_path / "missing.jsonl"}})
    records = runs["EKSFT"][0]
    assert runs["gone"] == {}
    assert series(records, _panel(SFT_PANELS, "loss").lines[0][1]) == ([1, 2], [2.0, 0.5])
    assert series(records, _panel(SFT_PANELS, "|M|").lines[0][1]) == ([1, 2], [0.2, 0.3])  # 8/40, 12/40
    entropy_on_m, entropy_rest = (getter for _, getter in _panel(SFT_PANELS, "mean entropy").lines)
    assert series(records, entropy_on_m) == ([1], [3.0]) and series(records, entropy_rest) == ([1], [1.0])


def test_rl_series_and_validation_accuracy(tmp_path):
    records = read_runs({"RL": {0: _write(tmp_path / "rl.jsonl", RL_LOG)}})["RL"][0]
    assert series(records, _panel(RL_PANELS, "reward").lines[0][1]) == ([1, 2], [-0.5, 0.0])
    # the mean of the acc keys of a step (0.5 and 0.7 at step 2); reward keys are not accuracy
    steps, values = series(records, _panel(RL_PANELS, "validation accuracy").lines[0][1])
    assert steps == [0, 2] and values[0] == 0.25 and abs(values[1] - 0.6) < 1e-12
    assert series(records, _panel(RL_PANELS, "step time").lines[0][1]) == ([1, 2], [10.0, 9.0])


def test_groups_kept_per_step_only_with_group_filtering(tmp_path):
    log = [{**record, RL_DISCARDED_GROUPS: 48} if record["step"] == 1 else record for record in RL_LOG]
    records = read_runs({"RL": {0: _write(tmp_path / "rl.jsonl", log)}})["RL"][0]
    assert rl_panels(None) == RL_PANELS
    # step 1: 16 kept of 16 + 48 judged; step 2 logged no discards: all kept; step 0 is validation only
    assert series(records, _panel(rl_panels(16), "groups DAPO kept").lines[0][1]) == ([1, 2], [0.25, 1.0])


def test_only_logged_panels_are_drawn(tmp_path):
    runs = read_runs({"SFT": {0: _write(tmp_path / "a.jsonl", [{"step": 1, "loss": 1.0, "stats/ce": 1.0}]),
                              1: _write(tmp_path / "b.jsonl", [{"step": 1, "loss": 1.1}])}})
    shown = logged_panels(runs, SFT_PANELS)
    assert [panel.title for panel in shown] == ["loss", "cross-entropy (stats/ce)"]
    plot_curves(runs, shown, "t", tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert logged_panels(read_runs({}), RL_PANELS) == []


def test_an_arm_keeps_its_colour_and_the_legend_has_its_own_cell(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(curves, "save_figure", lambda figure, path: figures.append(figure))
    runs = read_runs({"SFT": {0: _write(tmp_path / "sft.jsonl", SFT_LOG)}, "sweep": {0: tmp_path / "sft.jsonl"}})
    shown = logged_panels(runs, SFT_PANELS)
    plot_curves(runs, shown, "t", tmp_path / "curves.png")
    axes = figures[0].axes
    first = {line.get_label(): line.get_color() for line in axes[0].get_lines()}
    assert first == {"SFT": method_colour("SFT"), "sweep": method_colour("sweep")}  # the colours of every figure
    legend = axes[len(shown)]
    assert not legend.axison and [text.get_text() for text in legend.get_legend().get_texts()] == ["SFT", "sweep"]
