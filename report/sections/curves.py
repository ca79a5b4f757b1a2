"""Training curves of the SFT and RL runs of every arm and seed, from their ``metrics.jsonl``
(:mod:`report.analyses.curves`)."""
from __future__ import annotations

from pathlib import Path

from report.analyses.curves import SFT_PANELS, logged_panels, plot_curves, read_runs, rl_panels
from report.collect import Collected, model_title, row_label
from report.paper_figures import slug as _slug
from report.sections import Section
from common.config import Config
from common.grid import Grid, ModelGrid
from common.paths import TRAINING_METRICS_FILE


def render(grid: Grid, collected: Collected) -> Section:
    """``## Training curves``, one subsection per model over the Table 1 arms."""
    section = Section(["## Training curves", ""])
    for model in grid.models:
        section.lines += curves_section(grid.cfg, model, grid.variants, collected.out_dir, section)
    return section


def curves_section(cfg: Config, model: ModelGrid, labels: list[str], out_dir: Path, section) -> list[str]:
    """Training curves of the SFT runs and RL runs of ``labels`` (every seed), from their ``metrics.jsonl``."""
    title = model_title(model.cfg)
    lines = [f"### {title}", ""]
    rl_curves = rl_panels(cfg.rl.kept_groups_per_step)
    for phase, panels, what in (("sft", SFT_PANELS, "SFT"), ("rl", rl_curves, "RL (DAPO)")):
        paths = {}
        for variant in filter(model.has, labels):
            by_seed = {}
            for seed, arms in model.arms.items():
                folder = arms[variant].sft if phase == "sft" else arms[variant].rl
                if folder is not None and (folder / TRAINING_METRICS_FILE).exists():
                    by_seed[seed] = folder / TRAINING_METRICS_FILE
            if by_seed:
                paths[row_label(cfg, variant)] = by_seed
        runs = read_runs(paths)
        shown = logged_panels(runs, panels)
        if not shown:
            lines += [f"{what}: skipped, no {what} run of this model has a `{TRAINING_METRICS_FILE}` with these "
                      "quantities yet.", ""]
            continue
        relative = f"plots/curves_{_slug(title)}_{phase}.png"
        plot_curves(runs, shown, f"{title} · {what} training", out_dir / relative)
        section.add_output(relative, f"{what} training curves, {title}")
        left_out = [panel.title for panel in panels if panel not in shown]
        lines += [f"{what}: " + ", ".join(panel.title for panel in shown) + " over optimiser steps; one line per run "
                  f"and seed ({sum(len(s) for s in runs.values())} runs)."
                  + (f" Not logged by any run: {', '.join(left_out)}." if left_out else ""), "",
                  f"![{what} training curves]({relative})", ""]
    return lines
