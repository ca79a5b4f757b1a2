"""Training curves over optimiser steps from each run's ``metrics.jsonl``: SFT runs and RL (verl) runs.

SFT (``sft/trainer.py`` logs ``loss`` and every loss metric as ``stats/<key>``, averaged over the step's
micro-batches): loss, cross-entropy ``stats/ce``, mean token entropy and KL(π_θ‖π_ref) on the masked set M and on
the rest (``stats/entropy_mean_M`` / ``_rest``, ``stats/kl_mean_M`` / ``_rest``; only methods with masks log them),
and |M|/|T| = ``stats/num_M`` / ``stats/num_T``.

RL (verl's per-step records, copied by ``rl/train.py``): reward ``critic/score/mean`` (±1 plus the overlong
penalty), validation accuracy (the mean of the ``val-core/<source>/acc/mean@<n>`` keys, logged every
``rl.test_freq`` steps), ``response_length/mean``, ``actor/entropy``, ``timing_s/step`` and, with group filtering,
the share of the judged prompt groups DAPO kept.

A quantity no run logged is left out; a seed is one line, the seeds of a run share its colour.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from common.paths import (
    STAT_CE,
    STAT_ENTROPY_ON_M,
    STAT_ENTROPY_REST,
    STAT_KL_ON_M,
    STAT_KL_REST,
    set_size_stat,
    sft_stat_key,
)
from common.tracking import dapo_groups_kept
from report.analyses import method_colour, pyplot, save_figure
from report.analyses.iou import read_metrics_log

Record = dict
Getter = Callable[[Record], "float | None"]


def key(name: str) -> Getter:
    return lambda record: _number(record.get(name))


def ratio(numerator: str, denominator: str) -> Getter:
    def get(record: Record) -> float | None:
        top, bottom = _number(record.get(numerator)), _number(record.get(denominator))
        return None if top is None or not bottom else top / bottom
    return get


def mean_of_matching(prefix: str, part: str) -> Getter:
    """Mean of the record's values whose key starts with ``prefix`` and contains ``part`` (None if none)."""
    def get(record: Record) -> float | None:
        values = [_number(v) for k, v in record.items() if k.startswith(prefix) and part in k]
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None
    return get


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Panel:
    title: str
    lines: tuple[tuple[str, Getter], ...]
    """(line style name, getter): ``solid`` / ``dashed``; the panel title says what each style is."""


SFT_PANELS = (
    Panel("loss", (("solid", key("loss")),)),
    Panel(f"cross-entropy ({sft_stat_key(STAT_CE)})", (("solid", key(sft_stat_key(STAT_CE))),)),
    Panel("mean entropy: on M (solid), rest (dashed)",
          (("solid", key(sft_stat_key(STAT_ENTROPY_ON_M))), ("dashed", key(sft_stat_key(STAT_ENTROPY_REST))))),
    Panel("mean KL(π_θ‖π_ref): on M (solid), rest (dashed)",
          (("solid", key(sft_stat_key(STAT_KL_ON_M))), ("dashed", key(sft_stat_key(STAT_KL_REST))))),
    Panel("|M| / |T|", (("solid", ratio(sft_stat_key(set_size_stat("M")), sft_stat_key(set_size_stat("T")))),)),
)
RL_PANELS = (
    Panel("reward (critic/score/mean)", (("solid", key("critic/score/mean")),)),
    Panel("validation accuracy (val-core …/acc)", (("solid", mean_of_matching("val-core/", "/acc/")),)),
    Panel("response length (tokens, mean)", (("solid", key("response_length/mean")),)),
    Panel("actor entropy", (("solid", key("actor/entropy")),)),
    Panel("step time (s, timing_s/step)", (("solid", key("timing_s/step")),)),
)


def groups_kept(groups_per_step: int) -> Getter:
    """A training step's share of the judged prompt groups DAPO kept (:func:`common.tracking.dapo_groups_kept`);
    None for a record without a reward (validation only)."""
    return lambda record: (dapo_groups_kept({1: record}, groups_per_step)
                           if _number(record.get("critic/score/mean")) is not None else None)


def rl_panels(filtered_groups_per_step: int | None) -> tuple[Panel, ...]:
    """:data:`RL_PANELS`, plus the share of groups DAPO kept per step when it filters groups of
    ``filtered_groups_per_step`` kept prompts (``rl.train_batch_size``; None: no group filtering)."""
    if filtered_groups_per_step is None:
        return RL_PANELS
    return (*RL_PANELS, Panel("groups DAPO kept (share of judged)", (("solid", groups_kept(filtered_groups_per_step)),)))


def series(records: dict[int, Record], getter: Getter) -> tuple[list[int], list[float]]:
    """(steps, values) of the steps where ``getter`` finds a value; step 0 (verl's validation before training)
    counts only for quantities that have it."""
    points = [(step, getter(records[step])) for step in sorted(records)]
    kept = [(step, value) for step, value in points if value is not None]
    return [s for s, _ in kept], [v for _, v in kept]


def read_runs(paths: dict[str, dict[int, Path]]) -> dict[str, dict[int, dict[int, Record]]]:
    """{run label: {seed: metrics.jsonl path}} → {label: {seed: {step: record}}} for the files that exist."""
    return {label: {seed: read_metrics_log(path) for seed, path in by_seed.items() if path.exists()}
            for label, by_seed in paths.items()}


def logged_panels(runs: dict[str, dict[int, dict[int, Record]]], panels: tuple[Panel, ...]) -> list[Panel]:
    """The panels at least one run has a value for."""
    return [panel for panel in panels if any(series(records, getter)[0] for by_seed in runs.values()
                                             for records in by_seed.values() for _, getter in panel.lines)]


def plot_curves(runs: dict[str, dict[int, dict[int, Record]]], panels: list[Panel], title: str, path: Path) -> None:
    """One panel per quantity, one line per (run, seed); a run's seeds share its method's colour
    (:func:`report.analyses.method_colour`, the same in every figure). The legend has a cell of its own, after the
    panels, so it hides no line."""
    plt = pyplot()
    columns = min(3, len(panels) + 1)
    rows = -(-(len(panels) + 1) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), dpi=100, squeeze=False)
    for index, panel in enumerate(panels):
        axis = axes[index // columns][index % columns]
        for label, by_seed in runs.items():
            for s, records in enumerate(by_seed.values()):
                for style, getter in panel.lines:
                    steps, values = series(records, getter)
                    if steps:
                        axis.plot(steps, values, linestyle=style, linewidth=1, color=method_colour(label),
                                  marker="o" if len(steps) < 12 else None, markersize=3,
                                  label=label if s == 0 and style == "solid" else None)
        axis.set_title(panel.title, fontsize=9)
        axis.set_xlabel("step")
        axis.grid(True, alpha=0.3)
    for index in range(len(panels) + 1, rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    handles = {}  # label → line, over every panel (a run may be missing from the first)
    for axis in axes.flat:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    legend = axes[len(panels) // columns][len(panels) % columns]
    legend.axis("off")
    legend.legend(list(handles.values()), list(handles), loc="center", fontsize=8)
    figure.suptitle(title, fontsize=10)
    save_figure(figure, path)
