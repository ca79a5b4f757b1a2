"""Tables 1 and 2 (``table1``, ``table2``: :mod:`report.tables`) with their notes, the pass@k curves of each phase
(:mod:`report.plots`, their numbers :func:`report.paper_figures.write_passk_csv`) and the eval manifests they read."""
from __future__ import annotations

import os

from report.collect import PHASE_MODELS, PHASES, Collected, missing_seeds
from report.paper_figures import write_passk_csv, slug as _slug
from report.plots import plot_pass_at_k
from report.sections import Section
from report.tables import (
    AVERAGE,
    INTERVALS_LEGEND,
    TABLE_NOTE,
    Row,
    delta_label,
    p_value_record,
    primary_note,
    to_csv,
    to_latex,
    to_markdown,
    unjudged_note,
)
from common.grid import Grid
from common.manifest import read_manifest


def render(grid: Grid, collected: Collected) -> Section:
    """Per phase with evaluations: its table (written as md, csv, tex), notes, missing cells and seeds, pass@k curves
    and eval manifests; metrics: each row's Avg cells (:func:`average_metrics`) by phase."""
    cfg, out_dir = grid.cfg, collected.out_dir
    section = Section()
    lines = section.lines
    for phase, (table, files, curves) in collected.tables.items():
        name, _, stage = PHASES[phase]
        for suffix, write in (("md", to_markdown), ("csv", to_csv), ("tex", to_latex)):
            (out_dir / f"{name}.{suffix}").write_text(write(table), encoding="utf-8")
            section.add_output(f"{name}.{suffix}", f"{stage} ({suffix})")
        lines += [f"## {stage}", "", f"{table.caption}.", "", to_markdown(table),
                  TABLE_NOTE.format(delta=delta_label(table)), "", INTERVALS_LEGEND, "",
                  primary_note(table, f"report.primary_endpoints.{phase}", collected.endpoints[phase],
                               collected.absent[phase]), "",
                  unjudged_note(table), ""]
        lines.append("Numbers in parentheses are the paper's for the same cell." if table.has_paper_values else
                     "The paper has no numbers for these models and benchmarks, so only ours are shown.")
        lines += ["", f"Files: [{name}.md]({name}.md), [{name}.csv]({name}.csv) (with each seed's value), "
                      f"[{name}.tex]({name}.tex)", ""]
        missing = [f"{block.title} / {row.label}" for block in table.blocks for row in block.rows
                   if any(value is None for value in row.ours.values())]
        if missing:
            lines += [f"Missing evaluations (shown as –): {', '.join(missing)}", ""]
        partial = missing_seeds(cfg, table)
        if partial:
            lines += [f"Seeds missing (cells use the seeds present): {'; '.join(partial)}", ""]
        lines += ["### pass@k curves", ""]
        numbers = []
        for (title, bench), by_method in curves.items():
            stem = f"passk_{_slug(title)}_{phase}_{bench}"
            column = cfg.report.benchmark_labels.get(bench, bench)
            plot_pass_at_k(by_method, f"pass@k · {title} · {column} · {PHASE_MODELS[phase]}",
                           out_dir / f"plots/{stem}.png")
            write_passk_csv(by_method, out_dir / f"{stem}.csv")
            section.add_output(f"plots/{stem}.png", f"pass@k curves, {title}, {bench}, phase {phase}")
            section.add_output(f"{stem}.csv", f"pass@k and its 95% band per method and k, {title}, {bench}, "
                                           f"phase {phase}")
            lines.append(f"![{title} {bench}](plots/{stem}.png)")
            numbers.append(f"[{stem}.csv]({stem}.csv)")
        lines += ["", f"Numbers behind the curves: {', '.join(numbers)}", "", "### Eval manifests", ""]
        for key, path in files.items():
            manifest = read_manifest(path.parent)
            status = manifest.status if manifest else "no manifest"
            lines.append(f"* [{key}]({os.path.relpath(path.parent / 'manifest.json', out_dir)}) ({status})")
        lines.append("")
    section.metrics = {phase: {f"{block.title}/{row.label}": average_metrics(row)
                               for block in table.blocks for row in block.rows}
                       for phase, (table, _, _) in collected.tables.items()}
    return section


def average_metrics(row: Row) -> dict[str, float | list[float] | None]:
    """The row's Avg cells for the manifest: ``Avg pass@1`` (mean), ``Avg pass@1 95%`` ([low, high]),
    ``Avg pass@1 Δ vs reference`` ([mean, low, high]), the seed-level t-intervals of both (``… seed t 95%``) and,
    for a primary comparison, its Holm-adjusted p (``Avg pass@1 Δ vs reference p(Holm)``), where they exist."""
    metrics: dict[str, float | list[float] | None] = {}
    for (column, metric), value in row.ours.items():
        if column != AVERAGE:
            continue
        metrics[f"{column} {metric}"] = value
        if (column, metric) in row.intervals:
            interval = row.intervals[(column, metric)]
            metrics[f"{column} {metric} 95%"] = [interval.low, interval.high]
        if (column, metric) in row.delta:
            delta = row.delta[(column, metric)]
            metrics[f"{column} {metric} Δ vs reference"] = [delta.mean, delta.low, delta.high]
        for name, found in ((f"{column} {metric} seed t 95%", row.seed_intervals.get((column, metric))),
                            (f"{column} {metric} Δ vs reference seed t 95%", row.delta_seed.get((column, metric)))):
            if found is not None:
                metrics[name] = [found.low, found.high]
        if (column, metric) in row.primary:
            metrics[f"{column} {metric} Δ vs reference p(Holm)"] = p_value_record(row.primary[(column, metric)])
    return metrics
