"""The sweep tables: one per method evaluated with two or more labels (:mod:`report.sweep`), with its plot and, over
two numeric fields, one heatmap per metric."""
from __future__ import annotations

from pathlib import Path

from report.collect import PHASE_MODELS, PHASES, Collected, collect, evaluated_methods, model_title, row_label
from report.paper_figures import slug as _slug
from report.plots import plot_heatmap
from report.sections import Section
from report.sweep import Sweep, find_sweeps, format_values, plot_sweep
from report.tables import AVERAGE, ResultTable, to_csv, to_latex, to_markdown
from common.config import Config
from common.grid import Grid, ModelGrid
from common.paths import report_benchmarks


def render(grid: Grid, collected: Collected) -> Section:
    """``### Sweeps`` when ``report.analysis.run`` names the sweep analysis."""
    section = Section()
    if "sweep" in grid.cfg.report.analysis.run:
        section.lines = sweep_section(grid.cfg, sweep_tables(grid.cfg, grid.models), collected.out_dir, section)
    return section


def sweep_tables(cfg: Config, models: list[ModelGrid]
                 ) -> list[tuple[Config, str, Sweep, ResultTable, dict[str, Path]]]:
    """(model config, phase, sweep, table, metrics files) for every method evaluated with ≥ 2 labels."""
    found = []
    for model in models:
        mcfg = model.cfg
        for phase in PHASES:
            for sweep in find_sweeps(evaluated_methods(model, phase, report_benchmarks(cfg))):
                table, files, _ = collect(cfg, phase, [model], [label for label, _ in sweep.points])
                for row, (_, values) in zip(table.blocks[0].rows, sweep.points):
                    row.label = format_values(values)
                table.row_header = ", ".join(sweep.fields)
                table.caption = (f"Sweep of {row_label(cfg, sweep.method)} over {table.row_header} "
                                 f"({PHASES[phase][2]}): pass@1 (avg@n) and {table.metrics[1]} in percent")
                found.append((mcfg, phase, sweep, table, files))
    return found


def sweep_section(cfg: Config, sweeps: list, out_dir: Path, section) -> list[str]:
    lines = ["### Sweeps", ""]
    if not sweeps:
        return lines + ["Skipped: no method of this experiment was evaluated with two or more settings "
                        "(run a sweep, e.g. `python -m pipeline.run +sweep=eksft_rho ...`).", ""]
    for mcfg, phase, sweep, table, _ in sweeps:
        title = model_title(mcfg)
        stem = f"sweep_{_slug(title)}_{phase}_{sweep.name}"
        for suffix, render in (("md", to_markdown), ("csv", to_csv), ("tex", to_latex)):
            (out_dir / f"{stem}.{suffix}").write_text(render(table), encoding="utf-8")
            section.add_output(f"{stem}.{suffix}", f"{table.caption} ({suffix})")
        figure_title = f"Sweep · {title} · {row_label(cfg, sweep.method)} · {PHASE_MODELS[phase]}"
        plot_sweep(sweep, table, figure_title, out_dir / f"plots/{stem}.png")
        section.add_output(f"plots/{stem}.png", f"metrics vs {table.row_header}, {title}, phase {phase}")
        lines += [f"#### {table.caption}", "", to_markdown(table), f"![sweep](plots/{stem}.png)", "",
                  *sweep_heatmaps(sweep, table, figure_title, stem, out_dir, section),
                  f"Files: [{stem}.md]({stem}.md), [{stem}.csv]({stem}.csv), [{stem}.tex]({stem}.tex); labels "
                  + ", ".join(f"`{label}`" for label, _ in sweep.points), ""]
    return lines


def sweep_heatmaps(sweep: Sweep, table: ResultTable, title: str, stem: str, out_dir: Path, section) -> list[str]:
    """For a sweep over two numeric fields (the (λ_H, λ_KL) grid): one heatmap of the Avg per metric."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for _, values in sweep.points for v in values)
    if len(sweep.fields) != 2 or not numeric:
        return []
    xs = sorted({values[0] for _, values in sweep.points})
    ys = sorted({values[1] for _, values in sweep.points})
    links = []
    for metric in table.metrics:
        relative = f"plots/{stem}_heatmap_{metric.replace('@', '')}.png"
        cells = {values: row.ours.get((AVERAGE, metric))
                 for row, (_, values) in zip(table.blocks[0].rows, sweep.points)}
        plot_heatmap(xs, ys, cells, sweep.fields[0], sweep.fields[1], f"{AVERAGE} {metric} (%)",
                     f"{title} · {AVERAGE} {metric}", out_dir / relative)
        section.add_output(relative, f"{AVERAGE} {metric} over {sweep.fields[0]} x {sweep.fields[1]}, {title}")
        links.append(f"![{metric} heatmap]({relative})")
    return [" ".join(links), ""]
