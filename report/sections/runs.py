"""The commits, machines and run times the input runs' manifests record (:mod:`report.run_times`)."""
from __future__ import annotations

from report.collect import Collected
from report.run_times import CSV_NAME, read_run_times, run_times_section
from report.sections import Section
from common.grid import Grid
from common.paths import data_dir


def render(grid: Grid, collected: Collected) -> Section:
    """``## Runs`` over the data run and every input of the report; metrics ``runs``, and ``run_times.csv``."""
    cfg = grid.cfg
    data = data_dir(cfg)
    more, metrics = run_times_section(
        read_run_times({str(data.relative_to(cfg.experiment.run_root)): data, **collected.inputs}), collected.out_dir)
    section = Section(["## Runs", "", *more], metrics={"runs": metrics})
    if metrics:
        section.add_output(CSV_NAME, "per run: stage, status, commit, machine, attempts, seconds of work")
    return section
