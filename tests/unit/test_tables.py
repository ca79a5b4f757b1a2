"""Tables: paper numbers re-parsed from the .tex, bold/underline placement, Markdown, CSV and LaTeX layout."""
from __future__ import annotations

import re

import pytest

from eval.tables import (
    Block,
    ResultTable,
    Row,
    add_averages,
    attach_paper_values,
    cell_values,
    load_paper_tables,
    rank_marks,
    to_csv,
    to_latex,
    to_markdown,
)

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


def test_rank_marks_dense_with_ties_and_missing():
    assert rank_marks([25.6, 46.3, 36.5, 45.3, 40.9, 45.7]) == ["", "best", "", "", "", "second"]
    assert rank_marks([60.0, 73.3, 70.0, 73.3, None, 73.3]) == ["", "best", "second", "best", "", "best"]
    assert rank_marks([1.04, 1.0, 0.5]) == ["best", "best", "second"]  # ranked on the printed value
    assert rank_marks([None, None]) == ["", ""]


def _constructed_table() -> ResultTable:
    table = ResultTable(caption="t", row_header="Method", columns=["AIME", "Avg"], metrics=["pass@1", "pass@32"],
                        blocks=[])
    rows = [Row("Base", "base", {("AIME", "pass@1"): 10.0, ("AIME", "pass@32"): 50.0}),
            Row("SFT", "sft", {("AIME", "pass@1"): 30.0, ("AIME", "pass@32"): 60.0}),
            Row("EKSFT (Ours)", "eksft", {("AIME", "pass@1"): 20.0, ("AIME", "pass@32"): None})]
    for row in rows:
        add_averages(row, ["AIME"], table.metrics)
    table.blocks.append(Block("Qwen3-4B", rows))
    return table


def test_markdown_marks_best_bold_and_second_underlined_per_column():
    table = _constructed_table()
    attach_paper_values(table, "sft", load_paper_tables())
    lines = to_markdown(table).splitlines()
    assert lines[0] == "| Method | AIME pass@1 | AIME pass@32 | Avg pass@1 | Avg pass@32 |"
    assert lines[2].startswith("| ***Qwen3-4B***")
    assert lines[3] == "| Base | 10.0 (25.6) | <u>50.0</u> (60.0) | 10.0 (29.7) | <u>50.0</u> (55.8) |"
    assert lines[4] == "| SFT | **30.0** (46.3) | **60.0** (73.3) | **30.0** (41.0) | **60.0** (63.3) |"
    assert lines[5] == "| EKSFT (Ours) | <u>20.0</u> (45.7) | – (73.3) | <u>20.0</u> (41.7) | – (68.4) |"


def test_latex_and_csv_layout():
    table = _constructed_table()
    attach_paper_values(table, "sft", load_paper_tables())
    latex = to_latex(table)
    assert "\\begin{tabular}{l|cc | cc}" in latex
    assert "SFT & \\textbf{30.0} {\\scriptsize(46.3)} & \\textbf{60.0} {\\scriptsize(73.3)}" in latex
    assert "EKSFT (Ours) & \\underline{20.0} {\\scriptsize(45.7)} & – {\\scriptsize(73.3)}" in latex
    rows = to_csv(table).splitlines()
    assert rows[0] == ("model,method,variant,AIME pass@1,AIME pass@1 (paper),AIME pass@32,AIME pass@32 (paper),"
                       "Avg pass@1,Avg pass@1 (paper),Avg pass@32,Avg pass@32 (paper)")
    assert rows[3] == "Qwen3-4B,EKSFT (Ours),eksft,20.0,45.7,,73.3,20.0,41.7,,68.4"


def test_cell_values_use_the_unbiased_estimator():
    values = cell_values({"n": 4, "correct_counts": {"a": 1, "b": 0}}, k=4)
    assert values == {"pass@1": pytest.approx(12.5), "pass@4": pytest.approx(50.0)}
    values = cell_values({"n": 4, "correct_counts": {"a": 1, "b": 0}}, k=2)
    assert values["pass@2"] == pytest.approx(25.0)  # (1 - C(3,2)/C(4,2)) / 2
