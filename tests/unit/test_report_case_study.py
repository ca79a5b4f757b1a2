"""Case study inputs and HTML: the scored tokens of one tokenised SFT row, one coloured span per token."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from report.analyses import AnalysisInputError
from report.analyses.case_study import read_case_study_row, write_case_study


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "sft_tokens.parquet"
    pq.write_table(pa.table({"row_id": ["a", "b"], "input_ids": [[5, 6, 7, 8, 9], [5, 6, 7]],
                             "labels": [[-100, -100, 7, 8, 9], [-100, -100, -100]]}), path)
    return path


def test_scored_positions_are_the_first_response_tokens(tokens_file):
    tokens = read_case_study_row(tokens_file, row=0, max_tokens=2)
    assert (tokens.row_id, tokens.input_ids, tokens.positions) == ("a", [5, 6, 7, 8], [2, 3])
    assert read_case_study_row(tokens_file, row=0, max_tokens=10).positions == [2, 3, 4]


def test_bad_rows_are_named(tokens_file, tmp_path):
    with pytest.raises(AnalysisInputError, match="case_study_row=2 but .* has 2 rows"):
        read_case_study_row(tokens_file, row=2, max_tokens=4)
    with pytest.raises(AnalysisInputError, match=r"row 1 \(b\): no supervised response token"):
        read_case_study_row(tokens_file, row=1, max_tokens=4)
    with pytest.raises(AnalysisInputError, match="not found"):
        read_case_study_row(tmp_path / "missing.parquet", row=0, max_tokens=4)


def test_html_colours_each_token_by_its_probability(tmp_path):
    write_case_study({"Base": [0.25, 1.0], "SFT <x>": [0.5, 0.0]}, ["$x", "<b>"], "t", tmp_path / "p.png",
                     tmp_path / "c.html", tmp_path / "c.json")
    page = (tmp_path / "c.html").read_text()
    assert 'rgba(200, 0, 0, 0.250)' in page and 'title="Base · token 1: p = 1.0000">&lt;b&gt;</span>' in page
    assert "<th>SFT &lt;x&gt;</th>" in page
    assert (tmp_path / "p.png").stat().st_size > 1000
