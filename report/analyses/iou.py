"""IoU(M_H, M_KL) over the SFT steps of each EKSFT run (paper App. "Complementarity", Table "IoU": min/avg/max).

Source: each SFT run's ``metrics.jsonl``; the trainer logs every loss metric averaged over the step's micro-batches
as ``stats/<key>``: ``stats/iou`` = |M_H ∩ M_KL| / |M_H ∪ M_KL|, and the set sizes ``stats/num_T`` (valid tokens),
``stats/num_M_H``, ``stats/num_M_KL``, ``stats/num_M`` (M = M_H ∪ M_KL). Steps where M_H or M_KL is empty (at
step 1 the policy equals the reference, so every KL is 0 and M_KL is empty) have no meaningful IoU and are left out
of the summary; their count is reported.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from report.analyses import AnalysisInputError, method_colour, pyplot, save_figure
from common.paths import STAT_IOU, set_size_stat, sft_stat_key
from common.tracking import read_metrics

IOU_KEY = sft_stat_key(STAT_IOU)
SET_KEYS = {name: sft_stat_key(set_size_stat(name)) for name in ("M_H", "M_KL", "M")}
TOTAL_KEY = sft_stat_key(set_size_stat("T"))


@dataclass
class IoUSeries:
    """One run's per-step IoU and mask fractions |M_H|/|T|, |M_KL|/|T|, |M|/|T|."""

    steps: list[int]
    iou: list[float]
    fractions: dict[str, list[float]]
    """Set name (M_H, M_KL, M) → fraction of valid tokens per step (empty lists when the sizes were not logged)."""
    skipped_steps: int
    """Logged steps left out because M_H or M_KL was empty."""

    def summary(self) -> dict[str, float | int]:
        """``{"steps", "skipped_steps", "min", "avg", "max"}`` over the kept steps."""
        if not self.iou:
            raise AnalysisInputError("no step with non-empty M_H and M_KL to summarise")
        return {"steps": len(self.iou), "skipped_steps": self.skipped_steps, "min": min(self.iou),
                "avg": sum(self.iou) / len(self.iou), "max": max(self.iou)}


def read_metrics_log(path: Path) -> dict[int, dict]:
    """``metrics.jsonl`` as step → record (a step logged twice keeps its last line); a bad file is named."""
    try:
        return {int(record["step"]): record for record in read_metrics(path)}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise AnalysisInputError(f"{path}: not a JSONL file of metrics records with a 'step' ({exc!r})") from exc


def iou_series(path: Path) -> IoUSeries | None:
    """The IoU series of one run's ``metrics.jsonl``; None when it logs no ``stats/iou`` (not an EKSFT run)."""
    records = read_metrics_log(path)
    if not any(IOU_KEY in record for record in records.values()):
        return None
    has_sizes = all(key in record for record in records.values() if IOU_KEY in record
                    for key in (TOTAL_KEY, *SET_KEYS.values()))
    series = IoUSeries(steps=[], iou=[], fractions={name: [] for name in SET_KEYS}, skipped_steps=0)
    for step in sorted(records):
        record = records[step]
        if IOU_KEY not in record:
            continue
        if has_sizes and (record[SET_KEYS["M_H"]] == 0 or record[SET_KEYS["M_KL"]] == 0):
            series.skipped_steps += 1
            continue
        series.steps.append(step)
        series.iou.append(float(record[IOU_KEY]))
        if has_sizes:
            total = float(record[TOTAL_KEY])
            for name, key in SET_KEYS.items():
                series.fractions[name].append(float(record[key]) / total if total else 0.0)
    return series


def iou_markdown(summaries: dict[str, dict]) -> str:
    """The paper's IoU table, one row per run: | Run | Steps | Min | Avg | Max |."""
    lines = ["| Run | Steps | Min | Avg | Max |", "|---|:---:|:---:|:---:|:---:|"]
    for label, s in summaries.items():
        lines.append(f"| {label} | {s['steps']} | {s['min']:.2f} | {s['avg']:.2f} | {s['max']:.2f} |")
    return "\n".join(lines) + "\n"


def plot_iou(series: dict[str, IoUSeries], title: str, iou_path: Path, fractions_path: Path | None) -> None:
    """IoU vs step (one line per run, ``<method>[, seed <s>]``, in its method's colour:
    :func:`report.analyses.method_colour`); with ``fractions_path``, |M_H|, |M_KL|, |M| over |T| vs step in three
    panels."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6.0, 3.6), dpi=100)
    colours = {label: method_colour(label.split(", seed ")[0]) for label in series}
    for label, s in series.items():
        axes.plot(s.steps, s.iou, linewidth=1, label=label, color=colours[label])
    axes.set_xlabel("optimiser step")
    axes.set_ylabel("IoU(M_H, M_KL)")
    axes.set_ylim(0, 1)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    save_figure(figure, iou_path)
    if fractions_path is None:
        return
    figure, panels = plt.subplots(1, 3, figsize=(11.0, 3.4), dpi=100, sharey=True)
    for panel, (name, text) in zip(panels, (("M_H", "|M_H| / |T|"), ("M_KL", "|M_KL| / |T|"), ("M", "|M| / |T|"))):
        for label, s in series.items():
            if s.fractions[name]:
                panel.plot(s.steps, s.fractions[name], linewidth=1, label=label, color=colours[label])
        panel.set_title(text)
        panel.set_xlabel("optimiser step")
        panel.grid(True, alpha=0.3)
    panels[0].set_ylabel("fraction of valid tokens")
    panels[0].legend(fontsize=8)
    figure.suptitle(title)
    save_figure(figure, fractions_path)

