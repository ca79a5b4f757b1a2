"""LUFFY row validation: every error names the row index and the field; skip mode counts what it drops."""
from __future__ import annotations

import copy

import pytest

from data.loading import validate_rows
from data.schema import InvalidRowError, check_row, normalise_problem, problem_key

GOOD = {
    "data_source": "",
    "prompt": [{"role": "system", "content": "Think."}, {"role": "user", "content": "What is 1 + 1?"}],
    "target": [{"role": "assistant", "content": "<think>\n1 + 1 = 2.</think>\n\\boxed{2}"}],
    "ability": "math",
    "reward_model": {"ground_truth": "2", "style": "rule"},
    "extra_info": {"index": 0, "split": "default"},
}


def broken(path: str, value):
    row = copy.deepcopy(GOOD)
    keys = path.split(".")
    node = row
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node[key]
    last = keys[-1]
    if value is KeyError:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return row


def test_good_row_passes():
    check_row(GOOD, 0, "train.parquet")


@pytest.mark.parametrize("path, value, field", [
    ("target", KeyError, "target"),
    ("prompt", [], "prompt"),
    ("prompt.1.content", "  ", "prompt[1].content"),
    ("prompt.0.role", "assistant", "prompt[].role"),
    ("target.0.role", "user", "target[].role"),
    ("reward_model.ground_truth", 2, "reward_model.ground_truth"),
    ("extra_info.index", "7", "extra_info.index"),
    ("ability", None, "ability"),
])
def test_bad_row_error_names_row_and_field(path, value, field):
    with pytest.raises(InvalidRowError) as error:
        check_row(broken(path, value), 17, "train.parquet")
    assert str(error.value).startswith(f"train.parquet: row 17: field '{field}'")
    assert error.value.index == 17 and error.value.field == field


def test_skip_mode_counts_invalid_rows_and_error_mode_raises():
    rows = [GOOD, broken("reward_model.ground_truth", ""), GOOD, broken("target", KeyError)]
    kept, ids, invalid, by_field = validate_rows(rows, "x.jsonl", "skip")
    assert ids == [0, 2] and len(kept) == 2
    assert dict(by_field) == {"reward_model.ground_truth": 1, "target": 1}
    assert [entry["row"] for entry in invalid] == [1, 3]
    with pytest.raises(InvalidRowError, match="x.jsonl: row 1: field 'reward_model.ground_truth'"):
        validate_rows(rows, "x.jsonl", "error")


def test_problem_normalisation():
    assert normalise_problem("  What\tIS\n 1 +  1? ") == "what is 1 + 1?"
    assert problem_key("What is 1 + 1?") == problem_key("what  is 1 + 1?")
