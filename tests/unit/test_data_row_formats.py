"""Chat (OpenAI ``messages``, ShareGPT ``conversations``) and Alpaca rows become LUFFY rows (data/row_formats.py);
a bad row is one line naming the row and the field (issue 43.4)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas
import pytest

from common.config import compose
from common.paths import SFT_ROWS_FILE, data_dir
from data import prepare
from data.loading import load_rows
from data.row_formats import to_luffy_row
from data.schema import InvalidRowError, check_row

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "Put the final answer in \\boxed{}."
PROBLEMS = [(f"What is {a} + {b}?", f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}.") for a, b in
            [(2, 3), (10, 7), (4, 4), (12, 30), (5, 9), (1, 1)]]


def openai_row(problem: str, solution: str) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem},
                         {"role": "assistant", "content": solution}]}


def sharegpt_row(problem: str, solution: str) -> dict:
    return {"conversations": [{"from": "system", "value": SYSTEM}, {"from": "human", "value": problem},
                              {"from": "gpt", "value": solution}]}


def alpaca_row(problem: str, solution: str) -> dict:
    return {"instruction": SYSTEM, "input": problem, "output": solution}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_openai_and_sharegpt_rows_are_the_same_luffy_row():
    problem, solution = PROBLEMS[0]
    expected = {"data_source": "chat",
                "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem}],
                "target": [{"role": "assistant", "content": solution}], "ability": "math",
                "reward_model": {"ground_truth": "5", "style": "rule"}, "extra_info": {"index": 3, "split": "train"}}
    for row in (openai_row(problem, solution), sharegpt_row(problem, solution)):
        converted = to_luffy_row(row, 3, "x.jsonl", "chat")
        check_row(converted, 3, "x.jsonl")
        assert converted == expected


def test_an_alpaca_row_joins_instruction_and_input_and_an_answer_field_is_the_ground_truth():
    converted = to_luffy_row({"instruction": "Add.", "input": "2 + 3", "output": "It is 5.", "answer": 5}, 0, "a",
                             "alpaca")
    assert converted["prompt"] == [{"role": "user", "content": "Add.\n\n2 + 3"}]
    assert converted["target"] == [{"role": "assistant", "content": "It is 5."}]
    assert converted["reward_model"]["ground_truth"] == "5"
    assert to_luffy_row({"instruction": "Add 2 + 3.", "input": "", "output": "\\boxed{5}"}, 0, "a", "alpaca")[
        "prompt"] == [{"role": "user", "content": "Add 2 + 3."}]


@pytest.mark.parametrize("row_format, row, message", [
    ("alpaca", {"instruction": "Add.", "input": ""}, "a.jsonl: row 4: field 'output' is missing"),
    ("alpaca", {"instruction": " ", "output": "\\boxed{1}"}, "a.jsonl: row 4: field 'instruction' is empty"),
    ("alpaca", {"instruction": "Add.", "output": "five"},
     "a.jsonl: row 4: field 'answer' is missing, and the response"),
    ("chat", {"text": "hi"}, "a.jsonl: row 4: field 'messages' is missing (a chat row has messages"),
    ("chat", {"messages": [{"role": "user", "content": "2+3?"}, {"role": "assistant"}]},
     "a.jsonl: row 4: field 'messages[1].content' is missing"),
    ("chat", {"conversations": [{"from": "human", "value": "2+3?"}, {"from": "bot", "value": "\\boxed{5}"}]},
     "a.jsonl: row 4: field 'conversations[1].from' must be one of"),
    ("chat", {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "\\boxed{1}"},
                           {"role": "user", "content": "b"}, {"role": "assistant", "content": "\\boxed{2}"}]},
     "a.jsonl: row 4: field 'messages' must be one exchange, [system?, user, assistant]; got ['user', 'assistant', "),
])
def test_a_bad_row_names_its_row_and_field(row_format, row, message):
    with pytest.raises(InvalidRowError) as error:
        to_luffy_row(row, 4, "a.jsonl", row_format)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize("row_format, make_row", [("chat", openai_row), ("chat", sharegpt_row),
                                                  ("alpaca", alpaca_row)])
def test_a_jsonl_file_in_each_format_loads_as_luffy_rows(tmp_path, row_format, make_row):
    path = write_jsonl(tmp_path / "rows.jsonl", [make_row(*problem) for problem in PROBLEMS])
    cfg = compose(["experiment=demo", "data.source=local", f"data.path={path}", f"data.row_format={row_format}"])
    loaded = load_rows(cfg.data)
    assert loaded.row_ids == list(range(len(PROBLEMS)))
    assert [row["reward_model"]["ground_truth"] for row in loaded.rows] == ["5", "17", "8", "42", "14", "2"]


def test_the_row_format_is_in_the_data_run_identity(tmp_path):
    common = ["experiment=demo", "data.source=local", f"data.path={tmp_path / 'rows.jsonl'}"]
    assert data_dir(compose(common)) != data_dir(compose([*common, "data.row_format=chat"]))
    assert data_dir(compose(common)) == data_dir(compose([*common, "data.row_format=luffy"]))


def test_the_data_stage_writes_the_converted_rows_and_stops_at_a_bad_row_in_one_line(tmp_path):
    rows = [alpaca_row(*problem) for problem in PROBLEMS]
    path = write_jsonl(tmp_path / "alpaca.jsonl", rows)
    overrides = ["experiment=demo", "data.source=local", f"data.path={path}", "data.row_format=alpaca",
                 "data.num_sft_rows=4", "data.num_rl_val_rows=1", "toy.num_benchmark_problems=3",
                 f"experiment.run_root={tmp_path / 'runs'}"]
    assert prepare.run(compose(overrides)).complete
    sft = pandas.read_parquet(data_dir(compose(overrides)) / SFT_ROWS_FILE)
    assert len(sft) == 4 and {row["role"] for turns in sft["prompt"] for row in turns} == {"user"}

    write_jsonl(path, rows[:2] + [{"instruction": "Add.", "input": "1 + 1"}] + rows[3:])
    failed = subprocess.run([sys.executable, "-m", "data.prepare", *overrides], capture_output=True, text=True,
                            timeout=300, cwd=REPO)
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines()[-1] == f"error: {path}: row 2: field 'output' is missing"
    assert "Traceback" not in failed.stderr


def test_make_own_data_composes_the_own_data_experiment_on_the_rows_and_format_given(tmp_path):
    command = subprocess.run(["make", "-n", "--no-print-directory", "own-data", f"DATA={tmp_path / 'rows.jsonl'}",
                              "FORMAT=alpaca"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    overrides = command.split("-m pipeline.run ", 1)[1].split()
    cfg = compose(overrides)
    assert (cfg.experiment.name, cfg.data.source, cfg.data.path, cfg.data.row_format) == (
        "own_data", "local", str(tmp_path / "rows.jsonl"), "alpaca")
    assert cfg.model.source == "toy" and "rl" not in cfg.experiment.stages
    missing = subprocess.run(["make", "-n", "own-data"], cwd=REPO, capture_output=True, text=True)
    assert missing.returncode != 0 and "make own-data needs DATA=" in missing.stderr
