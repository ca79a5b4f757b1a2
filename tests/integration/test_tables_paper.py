"""The paper's numbers and bold marks in report/paper_tables.json re-parsed from the paper's .tex (../shared/docs)."""
from __future__ import annotations

import re

import pytest

from report.tables import load_paper_tables, rank_marks

COLUMNS = ["AIME", "AIME25", "AMC", "HMMT25", "Avg"]


def _parse_paper_table(tex: str, label: str) -> tuple[dict, dict]:
    """{model: {method: {column: {metric: value}}}} and {model: {method: {(column, metric): mark}}} of one table."""
    end = tex.index(f"\\label{{{label}}}")
    body = tex[tex.rindex("\\begin{tabular}", 0, end):end]
    values: dict = {}
    marks: dict = {}
    model = None
    for line in body.splitlines():
        title = re.search(r"\\textit\{([^}]*)\}", line)
        if "\\multicolumn{11}" in line and title:
            model = title.group(1)
            continue
        cells = [c.strip() for c in line.strip().removesuffix("\\\\").split("&")]
        if model is None or len(cells) != 11:
            continue
        method = cells[0].replace("{\\ourtitle}", "EKSFT")
        row, row_marks = {}, {}
        for index, cell in enumerate(cells[1:]):
            column, metric = COLUMNS[index // 2], ("pass@1", "pass@32")[index % 2]
            number = float(re.sub(r"\\(textbf|underline)\{([^}]*)\}", r"\2", cell))
            row.setdefault(column, {})[metric] = number
            row_marks[(column, metric)] = "best" if "textbf" in cell else "second" if "underline" in cell else ""
        values.setdefault(model, {})[method] = row
        marks.setdefault(model, {})[method] = row_marks
    return values, marks


@pytest.fixture(scope="module")
def paper_tex(shared_data) -> str:
    return (shared_data.parent / "docs" / "eksft_paper.tex").read_text(encoding="utf-8")


@pytest.mark.parametrize("phase, label", [("sft", "tab:stage1"), ("rl", "tab:stage2")])
def test_paper_tables_json_matches_the_tex(paper_tex, phase, label):
    values, _ = _parse_paper_table(paper_tex, label)
    assert load_paper_tables()[phase] == values
    assert set(values) == {"Qwen3-4B", "Qwen3-8B"} and all(len(rows) == 6 for rows in values.values())


@pytest.mark.parametrize("phase, label", [("sft", "tab:stage1"), ("rl", "tab:stage2")])
def test_our_bold_marks_match_the_papers(paper_tex, phase, label):
    values, marks = _parse_paper_table(paper_tex, label)
    for model, rows in values.items():
        methods = list(rows)
        for column in COLUMNS:
            for metric in ("pass@1", "pass@32"):
                ours = rank_marks([rows[m][column][metric] for m in methods])
                paper_best = [marks[model][m][(column, metric)] == "best" for m in methods]
                assert [mark == "best" for mark in ours] == paper_best, (model, column, metric)
