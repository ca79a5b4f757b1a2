"""Tables 1 and 2 in the paper's layout, from the eval stage's ``metrics.json`` files: Markdown, CSV and LaTeX.

One block per model; rows Base, then the SFT methods (``experiment.methods``) as labelled by ``eval.row_labels``;
columns per benchmark pass@1 (= avg@n) and pass@k (k = ``eval.table_k``, or the smallest n evaluated if that is
less; the unbiased estimator from each problem's correct count), then their mean over benchmarks ("Avg").

Every cell is the mean over seeds and problems with its 95% bootstrap interval (:mod:`eval.intervals`), in percent
with one decimal: ``62.5 [50.0, 75.0]``. Under each row of a block that has a reference row (SFT: variant ``sft``)
a ``Δ vs SFT`` line gives the paired difference to it with its interval (same seeds, same problems, same resampled
indices). Marks, per block and column: the best value is bold and the second best underlined only where the
intervals separate (the best's interval lies above every other row's; the second's above every row below it);
where they do not, the cell says "n.s." instead. The paper's own marks (no intervals) follow :func:`rank_marks`.
Where the paper has a number for the same model, row, benchmark and metric (``report/paper_tables.json``), it is
shown in parentheses next to ours. The CSV is long: one line per (model, method, column, metric) with the mean,
interval, paired difference, the paper's value and one column per seed.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from eval.intervals import Estimate, common_problems, estimate, paired_difference, value_matrix

PAPER_TABLES = Path(__file__).with_name("paper_tables.json")
AVERAGE = "Avg"
MISSING = "–"
NOT_SEPARATED = "n.s."
PAPER_ROWS = {"base": "Base", "sft": "SFT", "dft": "DFT", "iwsft": "IW-SFT", "psft": "PSFT",
              "eksft": "EKSFT (Ours)", "eksft_compatofficial_code": "EKSFT (Ours)"}
"""The paper's row (``paper_tables.json``) for each of our variants. The paper has one EKSFT row; its numbers came
from the official code, and both of our EKSFT arms (paper equations, official code) are shown against it."""
REFERENCE_VARIANT = "sft"
"""The variant every other row's paired difference is taken against."""


@dataclass
class Row:
    """One method of one model: our value and the paper's (if any) per (column, metric)."""

    label: str
    """Display name (e.g. ``EKSFT (Ours)``)."""
    variant: str
    """Eval folder name (``base``, ``eksft``, ``eksft_rho0.1``)."""
    ours: dict[tuple[str, str], float | None] = field(default_factory=dict)
    """Mean in percent per (column, metric); None where an evaluation is missing."""
    paper: dict[tuple[str, str], float] = field(default_factory=dict)
    evaluations: dict[str, dict[int, dict]] = field(default_factory=dict)
    """Benchmark column → seed → that seed's ``metrics.json`` (``n``, ``correct_counts``)."""
    intervals: dict[tuple[str, str], Estimate] = field(default_factory=dict)
    """The 95% interval of each cell with a value, in percent."""
    delta: dict[tuple[str, str], Estimate] = field(default_factory=dict)
    """Paired difference to the block's reference row, in percent (empty for the reference row itself)."""
    per_seed: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)
    """Each seed's own mean over problems, in percent."""


@dataclass
class Block:
    """The rows of one model."""

    title: str
    rows: list[Row]


@dataclass
class ResultTable:
    """A paper-style table: blocks of rows over (column, metric) cells."""

    caption: str
    row_header: str
    """``Method`` (Table 1) or ``Method(+DAPO)`` (Table 2)."""
    columns: list[str]
    """Benchmark titles, then ``Avg``."""
    metrics: list[str]
    """``pass@1`` and ``pass@<table_k>``."""
    blocks: list[Block]
    reference: str = "SFT"
    """Title of the reference row in the ``Δ vs …`` lines."""
    extra_columns: list[str] = field(default_factory=list)
    """Benchmark columns shown after ``Avg`` and left out of it (``data.extra_benchmarks``)."""

    @property
    def averaged_columns(self) -> list[str]:
        """The benchmark columns the ``Avg`` column averages: every one but ``Avg`` and :attr:`extra_columns`."""
        return [column for column in self.columns if column != AVERAGE and column not in self.extra_columns]

    @property
    def cells(self) -> list[tuple[str, str]]:
        return [(column, metric) for column in self.columns for metric in self.metrics]

    @property
    def has_paper_values(self) -> bool:
        return any(row.paper for block in self.blocks for row in block.rows)


def _metric_k(metric: str) -> int:
    return int(metric.split("@")[1])


def _groups(rows: Sequence[Row], columns: Sequence[str], k: int) -> tuple[list[int], list[list[np.ndarray]]] | None:
    """The seeds all ``rows`` share in every column and, per row, one [seeds, problems] matrix per column on those
    seeds and the problems all rows share in that column; None when a row lacks a column or nothing is shared."""
    if any(not row.evaluations.get(column) for row in rows for column in columns):
        return None
    seeds = sorted(set.intersection(*(set(row.evaluations[column]) for row in rows for column in columns)))
    if not seeds:
        return None
    groups: list[list[np.ndarray]] = [[] for _ in rows]
    for column in columns:
        problems = sorted(set.intersection(*(set(common_problems(row.evaluations[column], seeds)) for row in rows)))
        if not problems:
            return None
        for group, row in zip(groups, rows):
            group.append(value_matrix(row.evaluations[column], seeds, problems, k))
    return seeds, groups


def fill_estimates(table: ResultTable, reference_variant: str = REFERENCE_VARIANT) -> None:
    """Fills each row's ``ours`` (means), ``intervals``, ``per_seed`` and, where the block has a row of
    ``reference_variant``, ``delta`` from its ``evaluations``; ``Avg`` over :attr:`ResultTable.averaged_columns`."""
    benchmark_columns = table.averaged_columns
    for block in table.blocks:
        reference = next((row for row in block.rows if row.variant == reference_variant), None)
        if reference is not None:
            table.reference = reference.label
        for row in block.rows:
            for column, metric in table.cells:
                columns = benchmark_columns if column == AVERAGE else [column]
                k = _metric_k(metric)
                found = _groups([row], columns, k)
                if found is None:
                    row.ours[(column, metric)] = None
                    continue
                seeds, (groups,) = found
                cell = estimate(groups).scaled(100)
                row.ours[(column, metric)], row.intervals[(column, metric)] = cell.mean, cell
                row.per_seed[(column, metric)] = {seed: 100 * float(np.mean([g[i].mean() for g in groups]))
                                                  for i, seed in enumerate(seeds)}
                if reference is not None and row is not reference:
                    paired = _groups([row, reference], columns, k)
                    if paired is not None:
                        row.delta[(column, metric)] = paired_difference(*paired[1]).scaled(100)


@dataclass(frozen=True)
class Gain:
    """What RL added to one arm: Table 2 − Table 1 of the same variant, in points of the ``Avg`` column."""

    label: str
    variant: str
    gain: Estimate
    """Paired on the arm's own seeds and problems (the RL run of seed s starts from the SFT model of seed s)."""
    versus_reference: Estimate | None
    """``gain`` − the reference arm's gain, paired on the seeds and problems all four evaluations share (a
    difference in differences); None for the reference itself or when it has no gain."""
    per_seed: dict[int, float]


def rl_gains(before: ResultTable, after: ResultTable, metric: str,
             reference_variant: str = REFERENCE_VARIANT) -> list[tuple[str, list[Gain]]]:
    """Per block (model): the :class:`Gain` in ``metric`` of every Table 2 row whose variant has a Table 1 row,
    in Table 2's order. Each bootstrap replicate is linear in the values, so a gain's replicates are those of the
    per-(seed, problem) differences ``after − before``."""
    columns = after.averaged_columns
    k = _metric_k(metric)
    result = []
    for block_before, block_after in zip(before.blocks, after.blocks):
        pre_rl = {row.variant: row for row in block_before.rows}
        pairs = [(row, pre_rl[row.variant]) for row in block_after.rows if row.variant in pre_rl]
        reference = next(((a, b) for a, b in pairs if a.variant == reference_variant), None)
        gains = []
        for row_after, row_before in pairs:
            found = _groups([row_after, row_before], columns, k)
            if found is None:
                continue
            seeds, (after_groups, before_groups) = found
            differences = [a - b for a, b in zip(after_groups, before_groups)]
            versus = None
            if reference is not None and row_after is not reference[0]:
                shared = _groups([row_after, row_before, *reference], columns, k)
                if shared is not None:
                    mine_after, mine_before, theirs_after, theirs_before = shared[1]
                    versus = paired_difference([a - b for a, b in zip(mine_after, mine_before)],
                                               [a - b for a, b in zip(theirs_after, theirs_before)]).scaled(100)
            gains.append(Gain(row_after.label, row_after.variant, estimate(differences).scaled(100), versus,
                              {seed: 100 * float(np.mean([d[i].mean() for d in differences]))
                               for i, seed in enumerate(seeds)}))
        result.append((block_after.title, gains))
    return result


def load_paper_tables(path: Path = PAPER_TABLES) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["tables"]


def attach_paper_values(table: ResultTable, phase: str, paper_tables: dict) -> None:
    """Fills ``Row.paper`` for every cell the paper reports under the same model, row (:data:`PAPER_ROWS` of the
    row's variant), column and metric titles."""
    for block in table.blocks:
        for row in block.rows:
            paper_row = paper_tables.get(phase, {}).get(block.title, {}).get(PAPER_ROWS.get(row.variant), {})
            for column, metric in table.cells:
                value = paper_row.get(column, {}).get(metric)
                if value is not None:
                    row.paper[(column, metric)] = value


def rank_marks(values: Sequence[float | None]) -> list[str]:
    """``best`` / ``second`` / ``""`` per value, ranked on values rounded to one decimal (dense ranking)."""
    rounded = [None if v is None else round(v, 1) for v in values]
    distinct = sorted({v for v in rounded if v is not None}, reverse=True)
    marks = {value: mark for value, mark in zip(distinct, ("best", "second"))}
    return [marks.get(v, "") if v is not None else "" for v in rounded]


def interval_marks(estimates: Sequence[Estimate | None]) -> list[str]:
    """``best`` / ``second`` / ``n.s.`` / ``""`` per cell of one column.

    The top printed value (:func:`rank_marks`) is ``best`` when it is one row whose interval lies above every
    other row's, else ``n.s.``. After a ``best``, the next value is ``second`` when it is one row whose interval
    lies above every row below it, else ``n.s.``; after an ``n.s.`` nothing else is marked.
    """
    ranks = rank_marks([None if e is None else e.mean for e in estimates])
    marks = [""] * len(estimates)
    present = {i for i, e in enumerate(estimates) if e is not None}
    outranked: set[int] = set()
    for level in ("best", "second"):
        leaders = [i for i, rank in enumerate(ranks) if rank == level]
        if not leaders:
            break
        outranked |= set(leaders)
        below = present - outranked
        separated = len(leaders) == 1 and all(estimates[leaders[0]].separated_from(estimates[j]) for j in below)
        for i in leaders:
            marks[i] = level if separated else NOT_SEPARATED
        if not separated:
            break
    return marks


def _marks(table: ResultTable) -> dict[tuple[int, int, tuple[str, str]], str]:
    marks = {}
    for b, block in enumerate(table.blocks):
        for cell in table.cells:
            for r, mark in enumerate(interval_marks([row.intervals.get(cell) for row in block.rows])):
                marks[(b, r, cell)] = mark
    return marks


def _number(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def _signed(value: float) -> str:
    """``+1.5`` / ``−1.5`` (a true minus sign); a value that rounds to zero is ``+0.0``."""
    text = f"{value:+.1f}"
    return "+0.0" if text == "-0.0" else text.replace("-", "−")


def _interval(estimate_: Estimate, signed: bool = False) -> str:
    show = _signed if signed else _number
    return f"[{show(estimate_.low)}, {show(estimate_.high)}]"


def signed_estimate(estimate_: Estimate) -> str:
    """A difference with its interval: ``+12.5 [+0.0, +25.0]``."""
    return f"{_signed(estimate_.mean)} {_interval(estimate_, signed=True)}"


def delta_label(table: ResultTable) -> str:
    return f"Δ vs {table.reference}"


def to_markdown(table: ResultTable) -> str:
    """GitHub Markdown: mean [95% interval]; bold best, ``<u>`` second, ``n.s.`` where the intervals overlap; the
    paper's value in parentheses; a ``Δ vs SFT`` line under each row with a paired difference."""
    marks = _marks(table)
    header = [table.row_header] + [f"{column} {metric}" for column, metric in table.cells]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + [":---:"] * len(table.cells)) + "|"]
    for b, block in enumerate(table.blocks):
        lines.append("| " + " | ".join([f"***{block.title}***"] + [""] * len(table.cells)) + " |")
        for r, row in enumerate(block.rows):
            cells = []
            for cell in table.cells:
                text = _number(row.ours.get(cell))
                mark = marks[(b, r, cell)]
                text = f"**{text}**" if mark == "best" else f"<u>{text}</u>" if mark == "second" else text
                if cell in row.intervals:
                    text += f" {_interval(row.intervals[cell])}"
                if mark == NOT_SEPARATED:
                    text += f" {NOT_SEPARATED}"
                if cell in row.paper:
                    text += f" ({row.paper[cell]:.1f})"
                cells.append(text)
            lines.append("| " + " | ".join([row.label, *cells]) + " |")
            if row.delta:
                deltas = [signed_estimate(row.delta[cell])
                          if cell in row.delta else MISSING for cell in table.cells]
                lines.append("| " + " | ".join([f"<sub>{delta_label(table)}</sub>",
                                                *(f"<sub>{d}</sub>" for d in deltas)]) + " |")
    return "\n".join(lines) + "\n"


def to_csv(table: ResultTable) -> str:
    """Long format: one line per (model, method, column, metric): mean, 95% interval, mark, the paired difference
    to the reference row and its interval, the paper's value, the number of seeds, and one column per seed."""
    seeds = sorted({seed for block in table.blocks for row in block.rows for values in row.per_seed.values()
                    for seed in values})
    header = ["model", "method", "variant", "column", "metric", "mean", "ci_low", "ci_high", "mark",
              "delta_reference", "delta", "delta_low", "delta_high", "paper", "num_seeds",
              *(f"seed {seed}" for seed in seeds)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    marks = _marks(table)

    def number(value: float | None) -> str:
        return "" if value is None else f"{value:.4f}"

    for b, block in enumerate(table.blocks):
        for r, row in enumerate(block.rows):
            for cell in table.cells:
                interval, delta = row.intervals.get(cell), row.delta.get(cell)
                per_seed = row.per_seed.get(cell, {})
                writer.writerow([block.title, row.label, row.variant, *cell, number(row.ours.get(cell)),
                                 number(interval and interval.low), number(interval and interval.high),
                                 marks[(b, r, cell)], table.reference if delta else "",
                                 number(delta and delta.mean), number(delta and delta.low),
                                 number(delta and delta.high), number(row.paper.get(cell)), len(per_seed),
                                 *(number(per_seed.get(seed)) for seed in seeds)])
    return buffer.getvalue()


def _latex_escape(text: str) -> str:
    return text.replace("\\", "\\textbackslash{}").replace("&", "\\&").replace("%", "\\%").replace("_", "\\_") \
        .replace("#", "\\#")


def to_latex(table: ResultTable) -> str:
    """The paper's tabular: grouped pass@1 / pass@k columns, a block title per model, \\textbf and \\underline
    where the intervals separate (``n.s.`` superscript where not), the interval in \\scriptsize, and a
    ``Δ vs SFT`` line per row."""
    marks = _marks(table)
    width = 1 + len(table.cells)
    per_column = len(table.metrics)
    # a rule after the column before Avg, and after Avg itself when extra columns follow it
    ruled = [i < len(table.columns) - 1 and AVERAGE in table.columns[i:i + 2] for i in range(len(table.columns))]
    spec = "l|" + "".join("c" * per_column + (" | " if rule else " ") for rule in ruled).rstrip()
    column_titles = [f"\\multicolumn{{{per_column}}}{{c{'|' if rule else ''}}}"
                     f"{{\\textbf{{{_latex_escape(column)}}}}}" for column, rule in zip(table.columns, ruled)]
    lines = ["\\begin{table*}[t]", "\\centering", "\\small", "\\resizebox{\\textwidth}{!}{%",
             f"\\begin{{tabular}}{{{spec}}}", "\\hline",
             f"\\multirow{{2}}{{*}}{{\\textbf{{{_latex_escape(table.row_header)}}}}} & "
             + " & ".join(column_titles) + " \\\\",
             " & " + " & ".join(metric for _, metric in table.cells) + " \\\\", "\\hline"]
    for b, block in enumerate(table.blocks):
        lines += [f"\\multicolumn{{{width}}}{{c}}{{\\textbf{{\\textit{{{_latex_escape(block.title)}}}}}}} \\\\",
                  "\\hline"]
        for r, row in enumerate(block.rows):
            cells = []
            for cell in table.cells:
                text = _number(row.ours.get(cell))
                mark = marks[(b, r, cell)]
                text = f"\\textbf{{{text}}}" if mark == "best" else f"\\underline{{{text}}}" if mark == "second" \
                    else text
                if mark == NOT_SEPARATED:
                    text += f"\\textsuperscript{{{NOT_SEPARATED}}}"
                if cell in row.intervals:
                    text += f" {{\\scriptsize {_interval(row.intervals[cell])}}}"
                if cell in row.paper:
                    text += f" {{\\scriptsize({row.paper[cell]:.1f})}}"
                cells.append(text)
            lines.append(" & ".join([_latex_escape(row.label), *cells]) + " \\\\")
            if row.delta:
                deltas = [f"{{\\scriptsize {_signed(row.delta[cell].mean)} {_interval(row.delta[cell], signed=True)}}}"
                          .replace("−", "$-$") if cell in row.delta else MISSING for cell in table.cells]
                lines.append(" & ".join([f"{{\\scriptsize\\quad $\\Delta$ vs {_latex_escape(table.reference)}}}",
                                         *deltas]) + " \\\\")
        lines.append("\\hline")
    lines += ["\\end{tabular}%", "}", f"\\caption{{{_latex_escape(table.caption)}}}", "\\end{table*}"]
    return "\n".join(lines) + "\n"
