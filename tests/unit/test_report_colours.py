"""One colour per method across every figure of the report (issue 43: SFT was orange in the pass@k curves, where Base
took the first colour, and blue in the drift plots, where it did not), and figure titles that name the figure."""
from __future__ import annotations

from matplotlib.colors import to_hex

from report import plots
from report.analyses import METHOD_COLOURS, OTHER_COLOURS, drift, iou, method_colour
from report.analyses.drift import TensorDrift
from report.analyses.iou import IoUSeries


def _captured(monkeypatch) -> list:
    figures = []
    for module in (plots, drift, iou):
        monkeypatch.setattr(module, "save_figure", lambda figure, path: figures.append(figure))
    return figures


def _line_colours(figure) -> dict[str, str]:
    return {line.get_label(): to_hex(line.get_color()) for axes in figure.axes for line in axes.get_lines()}


def test_a_method_has_one_colour_in_every_figure_whatever_else_is_plotted(monkeypatch, tmp_path):
    figures = _captured(monkeypatch)
    doc = {0: {"n": 4, "correct_counts": {"p1": 2, "p2": 1}}}
    plots.plot_pass_at_k({"Base": doc, "SFT": doc, "EKSFT (paper eq.)": doc}, "t", tmp_path / "a.png")
    plots.plot_pass_at_k({"SFT": doc, "EKSFT (paper eq.)": doc}, "t", tmp_path / "b.png")  # Table 2: no Base
    tensor = [TensorDrift("w", 4, 2.0, 0.2, 1)]
    drift.plot_drift({"EKSFT (paper eq.)": tensor, "SFT": tensor}, 0.1, "t", tmp_path / "c.png", tmp_path / "d.png")
    series = IoUSeries(steps=[1, 2], iou=[0.5, 0.6], fractions={"M_H": [], "M_KL": [], "M": []}, skipped_steps=0)
    iou.plot_iou({"EKSFT (paper eq.), seed 0": series, "EKSFT (paper eq.), seed 1": series}, "t", tmp_path / "e.png",
                 None)
    found: dict[str, set[str]] = {}
    for figure in figures:
        for label, colour in _line_colours(figure).items():
            found.setdefault(label.split(", seed ")[0], set()).add(colour)
    bars = figures[3].axes[0].patches  # the drift fraction plot: one bar per method, in the order given
    found["EKSFT (paper eq.)"].add(to_hex(bars[0].get_facecolor()))
    found["SFT"].add(to_hex(bars[1].get_facecolor()))
    assert found == {"Base": {METHOD_COLOURS["Base"]}, "SFT": {METHOD_COLOURS["SFT"]},
                     "EKSFT (paper eq.)": {METHOD_COLOURS["EKSFT (paper eq.)"]}}


def test_methods_outside_the_papers_rows_get_a_stable_colour_of_their_own():
    assert method_colour("EKSFT (paper eq.), ρ 0.1") == method_colour("EKSFT (paper eq.), ρ 0.1")
    assert method_colour("EKSFT (paper eq.), ρ 0.1") in OTHER_COLOURS
    assert not set(OTHER_COLOURS) & set(METHOD_COLOURS.values())
    assert len(set(METHOD_COLOURS.values())) == len(METHOD_COLOURS)


def test_drift_figures_are_titled_by_what_they_show(monkeypatch, tmp_path):
    # Issue 43: both drift plots were titled "<model> · Table 1 (stage 1: without RL)".
    figures = _captured(monkeypatch)
    drift.plot_drift({"SFT": [TensorDrift("w", 4, 2.0, 0.2, 1)]}, 0.1, "Toy · after SFT", tmp_path / "a.png",
                     tmp_path / "b.png")
    assert [figure.axes[0].get_title() for figure in figures] == [
        "Parameter drift per layer · Toy · after SFT", "Weights changed by more than 0.1·|θ₀| · Toy · after SFT"]
