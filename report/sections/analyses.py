"""The analyses of ``report.analysis.run`` that compare one model's checkpoints, model by model: parameter drift, IoU,
the case study (the paper's IoU table and the sweeps, across models, are sections of their own)."""
from __future__ import annotations

from report.collect import Collected
from report.sections import Section, case_study, drift, iou
from common.grid import Grid

PER_MODEL = (("drift", drift.render), ("iou", iou.render), ("case_study", case_study.render))
"""Each analysis's name in ``report.analysis.run`` and its section, in the order each model shows them."""


def render(grid: Grid, collected: Collected) -> Section:
    """``## Analyses`` (when ``report.analysis.run`` names any), then per model each analysis it names."""
    analyses = grid.cfg.report.analysis.run
    section = Section(["## Analyses", ""] if analyses else [])
    for model in grid.models:
        one_model = Grid(grid.cfg, [model])
        for name, render_model in PER_MODEL:
            if name in analyses:
                section.extend(render_model(one_model, collected))
    return section
