"""IoU(M_H, M_KL) over the SFT steps of every EKSFT run (:mod:`report.analyses.iou`): per model, and the paper's IoU
table (``tab:iou``) over all of them."""
from __future__ import annotations

import json
from pathlib import Path

from report.analyses.iou import IoUSeries, iou_markdown, iou_series, plot_iou
from report.collect import Collected, model_title, row_label, trained_exports
from report.paper_figures import iou_table, slug as _slug
from report.sections import Section, per_model
from report.tables import load_paper_tables
from common.config import Config
from common.grid import Grid, ModelGrid
from common.paths import TRAINING_METRICS_FILE


def render(grid: Grid, collected: Collected) -> Section:
    """One subsection per model; metrics ``iou/<model>``: {run: min/avg/max}."""
    return per_model(grid, collected, "iou", iou_section)


def render_paper_table(grid: Grid, collected: Collected) -> Section:
    """The paper's IoU table over every model's runs that logged IoU; nothing without the IoU analysis or such runs."""
    section = Section()
    if "iou" not in grid.cfg.report.analysis.run:
        return section
    runs = {}
    for model in grid.models:
        summaries = {label: found.summary() for label, found in iou_runs(grid.cfg, model).items()}
        if summaries:
            runs[model_title(model.cfg)] = summaries
    if runs:
        section.lines = paper_iou_section(runs, collected.out_dir, section)
    return section


TOY_IOU_NOTE = ("Why a toy model's IoU is far above the paper's 0.50 (0.97 on average for EKSFT with the paper's "
                "equation in the forking world): a response of the 0.84M toy model has a few uncertain tokens (the "
                "fork, some digits) among near-certain ones, and the paper's regulariser makes the model uncertain "
                "exactly where it moves away from the reference, so the top ρ = 20% by entropy and the top 20% by KL "
                "are nearly the same tokens; a Qwen3 solution has many uncertain tokens, ranked differently by the two "
                "(docs/results/2026-11-23-forking-verified-teacher.md).")
"""The sentence under a toy model's IoU table."""


def iou_runs(cfg: Config, model: ModelGrid) -> dict[str, IoUSeries]:
    """Row label (``<method>, seed <s>`` when there are several seeds) → IoU series of every complete SFT run of
    ``model`` that logged ``stats/iou``."""
    series = {}
    seeds = model.arms
    for seed, arms in seeds.items():
        for variant, stage in trained_exports(arms, "sft").items():
            if (stage / TRAINING_METRICS_FILE).exists():
                found = iou_series(stage / TRAINING_METRICS_FILE)
                if found is not None and found.iou:
                    series[row_label(cfg, variant) + (f", seed {seed}" if len(seeds) > 1 else "")] = found
    return series


def iou_section(cfg: Config, model: ModelGrid, out_dir: Path, section) -> tuple[list[str], dict]:
    """IoU(M_H, M_KL) over the SFT steps of every run that logged it, each seed's run on its own row (``<method>,
    seed <s>`` when there are several seeds): Markdown lines and {run: min/avg/max}."""
    title = model_title(model.cfg)
    name = _slug(title)
    lines = [f"### IoU(M_H, M_KL) over SFT steps: {title}", ""]
    series = iou_runs(cfg, model)
    if not series:
        return lines + ["Skipped: no complete SFT run of this model logged `stats/iou` (only EKSFT runs do).", ""], {}
    summaries = {label: s.summary() for label, s in series.items()}
    has_fractions = any(s.fractions["M"] for s in series.values())
    stem = f"iou_{name}"
    plot_iou(series, f"{title} · IoU(M_H, M_KL)", out_dir / f"plots/{stem}.png",
             out_dir / f"plots/{stem}_mask_fractions.png" if has_fractions else None)
    table = iou_markdown(summaries)
    (out_dir / f"{stem}.md").write_text(table, encoding="utf-8")
    (out_dir / f"{stem}.json").write_text(json.dumps(summaries, indent=1) + "\n", encoding="utf-8")
    section.add_output(f"{stem}.md", f"IoU min/avg/max per EKSFT run, {title}")
    section.add_output(f"{stem}.json", f"IoU min/avg/max per EKSFT run, {title}")
    section.add_output(f"plots/{stem}.png", f"IoU vs step, {title}")
    skipped = sum(s["skipped_steps"] for s in summaries.values())
    lines += [table, "Steps where M_H or M_KL was empty (the first step: π_θ = π_ref, every KL is 0) are left out"
              f" ({skipped} in all). Paper (Qwen3, ρ = 0.2): min 0.09, avg 0.50, max 0.59."
              + (f" {TOY_IOU_NOTE}" if model.cfg.model.source == "toy" else ""), "",
              f"![IoU]({f'plots/{stem}.png'})"]
    if has_fractions:
        section.add_output(f"plots/{stem}_mask_fractions.png", f"|M_H|, |M_KL|, |M| over |T| vs step, {title}")
        lines.append(f"![mask fractions](plots/{stem}_mask_fractions.png)")
    return lines + ["", f"Files: [{stem}.md]({stem}.md), [{stem}.json]({stem}.json)", ""], summaries


def paper_iou_section(runs: dict[str, dict[str, dict]], out_dir: Path, section) -> list[str]:
    """The paper's IoU table (``tab:iou``) over every run that logged IoU (``runs``: model title → run label →
    summary)."""
    rendered = iou_table(runs, load_paper_tables()["iou"])
    for suffix, text in rendered.items():
        (out_dir / f"tab_iou.{suffix}").write_text(text, encoding="utf-8")
        section.add_output(f"tab_iou.{suffix}", f"the paper's tab:iou ({suffix})")
    return ["### The paper's IoU table (`tab:iou`)", "", rendered["md"],
            "Each value over the run's SFT steps with M_H and M_KL non-empty (a statistic of one run, no interval); "
            "the paper's (Qwen3, ρ = 0.2) in the last column.", "",
            "Files: [tab_iou.md](tab_iou.md), [tab_iou.csv](tab_iou.csv), [tab_iou.tex](tab_iou.tex)", ""]
