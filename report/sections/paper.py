"""The paper's ablation tables that Table 1's evaluations hold arms for (:mod:`report.ablation_tables`) and its
Figure 1, Base vs SFT pass@k (:func:`report.paper_figures.write_base_vs_sft`)."""
from __future__ import annotations

from pathlib import Path

from report.ablation_tables import ablation_tables
from report.collect import Collected, PhaseTable
from report.paper_figures import base_vs_sft_lines, curve_benchmarks, write_base_vs_sft
from report.sections import Section
from report.tables import INTERVALS_LEGEND, TABLE_NOTE, delta_label, load_paper_tables, to_csv, to_latex, to_markdown
from common.config import Config
from common.grid import Grid


def render(grid: Grid, collected: Collected) -> Section:
    """The ablation tables and Figure 1; nothing without Table 1."""
    section = Section()
    if "sft" in collected.tables:
        section.lines = paper_sft_sections(grid.cfg, collected.tables["sft"], collected.out_dir, section)
    return section


def paper_sft_sections(cfg: Config, sft: PhaseTable, out_dir: Path, section) -> list[str]:
    """The paper's ablation tables that Table 1's evaluations hold (:mod:`report.ablation_tables`) and its Figure 1
    (:func:`report.paper_figures.write_base_vs_sft`, on the curve benchmarks)."""
    table, _, curves = sft
    lines = []
    for spec, ablation in ablation_tables(cfg, table, load_paper_tables()):
        for suffix, render in (("md", to_markdown), ("csv", to_csv), ("tex", to_latex)):
            (out_dir / f"{spec.stem}.{suffix}").write_text(render(ablation), encoding="utf-8")
            section.add_output(f"{spec.stem}.{suffix}", f"the paper's tab:{spec.key} ({suffix})")
        lines += [f"## {spec.caption} (paper: `tab:{spec.key}`)", "", f"{ablation.caption}.", "", to_markdown(ablation),
                  TABLE_NOTE.format(delta=delta_label(ablation)), "", INTERVALS_LEGEND,
                  "The ablation tables declare no primary comparison: every Δ is exploratory.",
                  "Numbers in parentheses are the paper's for the same cell." if ablation.has_paper_values else
                  "The paper has no numbers for these models and benchmarks, so only ours are shown.", "",
                  f"Files: [{spec.stem}.md]({spec.stem}.md), [{spec.stem}.csv]({spec.stem}.csv), "
                  f"[{spec.stem}.tex]({spec.stem}.tex)", ""]
    benchmarks = {bench: cfg.report.benchmark_labels.get(bench, bench) for bench in curve_benchmarks(curves)}
    figures = write_base_vs_sft(table, benchmarks, out_dir)
    for figure in figures:
        section.add_output(figure.png, f"Base vs SFT pass@k (paper Figure 1), {figure.model}, {figure.benchmark}")
        section.add_output(figure.csv, f"Base and SFT pass@k for every k, {figure.model}, {figure.benchmark}")
    return lines + base_vs_sft_lines(figures)
