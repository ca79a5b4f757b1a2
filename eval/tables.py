"""Tables 1 and 2 in the paper's layout, from the eval stage's ``metrics.json`` files: Markdown, CSV and LaTeX.

One block per model; rows Base, then the SFT methods (``experiment.methods``) as labelled by ``eval.row_labels``;
columns per benchmark pass@1 (= avg@n) and pass@k (k = ``eval.table_k``, or the smallest n evaluated if that is
less; the unbiased estimator from each problem's correct count), then their mean over benchmarks ("Avg"). Values are percentages with one decimal.
Within a block, the best value of a column is bold and the second best underlined, ranked on the printed values
(ties share a mark; the second best is the next distinct value). The paper itself is not consistent about
underlining below a tie (Table 1, Qwen3-4B AIME pass@32 leaves 70.0 plain; HMMT25 on Qwen3-8B underlines 40.0).
Where the paper has a number for the same model, row, benchmark and metric (``eval/paper_tables.json``), it is
shown in parentheses next to ours.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from eval.metrics import pass_at_k

PAPER_TABLES = Path(__file__).with_name("paper_tables.json")
AVERAGE = "Avg"
MISSING = "–"


@dataclass
class Row:
    """One method of one model: our value and the paper's (if any) per (column, metric)."""

    label: str
    """Display name (e.g. ``EKSFT (Ours)``)."""
    variant: str
    """Eval folder name (``base``, ``eksft``, ``eksft_rho0.1``)."""
    ours: dict[tuple[str, str], float | None] = field(default_factory=dict)
    paper: dict[tuple[str, str], float] = field(default_factory=dict)


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

    @property
    def cells(self) -> list[tuple[str, str]]:
        return [(column, metric) for column in self.columns for metric in self.metrics]

    @property
    def has_paper_values(self) -> bool:
        return any(row.paper for block in self.blocks for row in block.rows)


def cell_values(metrics_doc: dict, k: int) -> dict[str, float]:
    """``pass@1`` (avg@n) and ``pass@<k>`` in percent from one ``metrics.json`` (unbiased, from the correct counts)."""
    n, counts = metrics_doc["n"], list(metrics_doc["correct_counts"].values())
    return {"pass@1": 100 * sum(c / n for c in counts) / len(counts),
            f"pass@{k}": 100 * sum(pass_at_k(n, c, k) for c in counts) / len(counts)}


def add_averages(row: Row, benchmark_columns: Sequence[str], metrics: Sequence[str]) -> None:
    """``Avg`` = mean over benchmarks of each metric; missing if any benchmark is missing."""
    for metric in metrics:
        values = [row.ours.get((column, metric)) for column in benchmark_columns]
        row.ours[(AVERAGE, metric)] = None if None in values else sum(values) / len(values)


def load_paper_tables(path: Path = PAPER_TABLES) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["tables"]


def attach_paper_values(table: ResultTable, phase: str, paper_tables: dict) -> None:
    """Fills ``Row.paper`` for every cell the paper reports under the same model, row, column and metric titles."""
    for block in table.blocks:
        for row in block.rows:
            paper_row = paper_tables.get(phase, {}).get(block.title, {}).get(row.label, {})
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


def _marks(table: ResultTable) -> dict[tuple[int, int, tuple[str, str]], str]:
    marks = {}
    for b, block in enumerate(table.blocks):
        for cell in table.cells:
            for r, mark in enumerate(rank_marks([row.ours.get(cell) for row in block.rows])):
                marks[(b, r, cell)] = mark
    return marks


def _number(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def to_markdown(table: ResultTable) -> str:
    """GitHub Markdown: bold best, ``<u>`` second; the paper's value in parentheses."""
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
                if cell in row.paper:
                    text += f" ({row.paper[cell]:.1f})"
                cells.append(text)
            lines.append("| " + " | ".join([row.label, *cells]) + " |")
    return "\n".join(lines) + "\n"


def to_csv(table: ResultTable) -> str:
    """One line per (model, method); a ``(paper)`` column after each cell the paper reports."""
    paper_cells = {cell for block in table.blocks for row in block.rows for cell in row.paper}
    header = ["model", "method", "variant"]
    for cell in table.cells:
        header.append(f"{cell[0]} {cell[1]}")
        if cell in paper_cells:
            header.append(f"{cell[0]} {cell[1]} (paper)")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for block in table.blocks:
        for row in block.rows:
            line = [block.title, row.label, row.variant]
            for cell in table.cells:
                value = row.ours.get(cell)
                line.append("" if value is None else f"{value:.1f}")
                if cell in paper_cells:
                    line.append("" if cell not in row.paper else f"{row.paper[cell]:.1f}")
            writer.writerow(line)
    return buffer.getvalue()


def _latex_escape(text: str) -> str:
    return text.replace("\\", "\\textbackslash{}").replace("&", "\\&").replace("%", "\\%").replace("_", "\\_") \
        .replace("#", "\\#")


def to_latex(table: ResultTable) -> str:
    """The paper's tabular: grouped pass@1 / pass@k columns, a block title per model, \\textbf and \\underline."""
    marks = _marks(table)
    width = 1 + len(table.cells)
    per_column = len(table.metrics)
    spec = "l|" + " ".join(["c" * per_column] * (len(table.columns) - 1)) + " | " + "c" * per_column
    column_titles = [f"\\multicolumn{{{per_column}}}{{c{'|' if i == len(table.columns) - 2 else ''}}}"
                     f"{{\\textbf{{{_latex_escape(column)}}}}}" for i, column in enumerate(table.columns)]
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
                if cell in row.paper:
                    text += f" {{\\scriptsize({row.paper[cell]:.1f})}}"
                cells.append(text)
            lines.append(" & ".join([_latex_escape(row.label), *cells]) + " \\\\")
        lines.append("\\hline")
    lines += ["\\end{tabular}%", "}", f"\\caption{{{_latex_escape(table.caption)}}}", "\\end{table*}"]
    return "\n".join(lines) + "\n"
