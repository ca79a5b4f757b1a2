"""Sweep aggregation: groups the points of a Hydra multirun sweep and lays them out like the paper's ratio table
(rows = swept values, columns = benchmarks pass@1 / pass@k + Avg) and plot.

Every sweep point trains its own ``sft/<model>/<label>-<id>/`` run and evaluates it in its own folders
(``common.paths``). The report's points are the experiment's arms plus the other complete SFT runs the current config
would train with another method (``common.grid.sweep_arms``: same data, seed and settings), each with the method
its SFT manifest records; :func:`find_sweeps` groups those evaluated in a phase by method: a method with two or more
labels is a sweep over the fields whose values differ among them (``rho`` for ``eksft``, ``eksft_rho0``,
``eksft_rho0.1``, …; the defaults' label counts as the point at the default value). The base model and
``eval.model_path`` evaluations have no method and are not sweep points.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping

from report.analyses import pyplot, save_figure
from report.tables import AVERAGE, ResultTable
from common.config.sft import SFTMethod


@dataclass
class Sweep:
    """The evaluated points of one method that differ in ``fields``."""

    method: str
    fields: list[str]
    """Swept fields, in schema order."""
    points: list[tuple[str, tuple]]
    """(label, values of ``fields``), sorted by the values."""

    @property
    def name(self) -> str:
        return f"{self.method}_{'_'.join(self.fields)}"


def find_sweeps(methods: Mapping[str, SFTMethod]) -> list[Sweep]:
    """Groups labelled methods by method name; every method with ≥ 2 labels is a :class:`Sweep` over its differing
    fields."""
    by_method: dict[str, list[tuple[str, SFTMethod]]] = {}
    for label, method in methods.items():
        by_method.setdefault(method.name, []).append((label, method))
    sweeps = []
    for name, members in by_method.items():
        if len(members) < 2:
            continue
        swept = [f.name for f in fields(members[0][1]) if f.name != "name" and
                 len({repr(getattr(method, f.name)) for _, method in members}) > 1]
        points = [(label, tuple(getattr(method, field) for field in swept)) for label, method in members]
        sweeps.append(Sweep(method=name, fields=swept, points=sorted(points, key=lambda p: _sort_key(p[1]))))
    return sweeps


def _sort_key(values: tuple) -> tuple:
    return tuple((0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, repr(v))
                 for v in values)


def format_values(values: tuple) -> str:
    """``0.1`` or ``0.05, 0.1``: the row title of a sweep point."""
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def plot_sweep(sweep: Sweep, table: ResultTable, title: str, path: Path) -> None:
    """Metric vs the first swept field, one panel per metric (pass@1, pass@k) of ``table``'s single block.

    One swept field: one line per benchmark plus Avg (bold). More: the Avg only, one line per value of the others.
    """
    plt = pyplot()
    rows = table.blocks[0].rows
    numeric = all(isinstance(values[0], (int, float)) and not isinstance(values[0], bool) for _, values in sweep.points)
    x_of = {label: (values[0] if numeric else i) for i, (label, values) in enumerate(sweep.points)}
    figure, panels = plt.subplots(1, len(table.metrics), figsize=(4.2 * len(table.metrics), 3.4), dpi=100)
    for panel, metric in zip(panels, table.metrics):
        if len(sweep.fields) == 1:
            series = {column: [(x_of[row.variant], row.ours.get((column, metric))) for row in rows]
                      for column in table.columns}
        else:
            series = {}
            for row, (_, values) in zip(rows, sweep.points):
                key = ", ".join(f"{field}={format_values((v,))}" for field, v in zip(sweep.fields[1:], values[1:]))
                series.setdefault(key, []).append((x_of[row.variant], row.ours.get((AVERAGE, metric))))
        for name, points in series.items():
            kept = [(x, y) for x, y in points if y is not None]
            style = {"linewidth": 2.5, "color": "black"} if name == AVERAGE else {"linewidth": 1}
            panel.plot([x for x, _ in kept], [y for _, y in kept], marker="o", markersize=3, label=name, **style)
        if not numeric:
            panel.set_xticks(list(x_of.values()), [format_values(values[:1]) for _, values in sweep.points])
        panel.set_xlabel(sweep.fields[0])
        panel.set_ylabel(f"{metric} (%)" + ("" if len(sweep.fields) == 1 else f", {AVERAGE}"))
        panel.grid(True, alpha=0.3)
    panels[0].legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    save_figure(figure, path)
