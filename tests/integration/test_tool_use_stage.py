"""The data stage's tool-use path (issue 16): AceBench's folder or the synthetic set -> sft.parquet and a manifest
with the math set's fields (invalid-row policy, duplicates, split counts), then tokens by the tool template."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from bench.tiny_model import build_tiny_tokenizer
from common.config import compose
from common.config.data import CHATML_TOOLS_TEMPLATE
from common.paths import data_dir
from data import prepare
from data.formatting import IGNORE_INDEX
from data.tokenize_sft import tokenise_rows
from data.tool_use import ACEBENCH_SINGLE_TURN, TOOL_PARQUET_COLUMNS, InvalidToolRowError

LAMP = {"name": "lamp_dim", "description": "Dim a lamp.",
        "parameters": {"type": "object", "properties": {"level": {"type": "integer", "description": "Percent."}},
                       "required": ["level"]}}


def write_acebench(folder, extra_rows=()):
    """One row per single-turn category in AceBench's original layout, plus ``extra_rows`` (category, row, truth)."""
    (folder / "possible_answer").mkdir(parents=True)
    entries = [(c, {"id": f"{c}_0", "question": f"user: Dim the lamp to {i} percent.\n", "function": [LAMP],
                    "time": ""}, {"lamp_dim": {"level": i}}) for i, c in enumerate(ACEBENCH_SINGLE_TURN)]
    for category in ACEBENCH_SINGLE_TURN:
        chosen = [(row, truth) for c, row, truth in [*entries, *extra_rows] if c == category]
        (folder / f"data_{category}.json").write_text("".join(json.dumps(r) + "\n" for r, _ in chosen))
        (folder / "possible_answer" / f"data_{category}.json").write_text(
            "".join(json.dumps({"id": r["id"], "ground_truth": t}) + "\n" for r, t in chosen))


BROKEN = ("normal_atom_bool", {"id": "normal_atom_bool_1", "question": "user: Dim it.\nsystem: ok\nuser: Again.",
                               "function": [LAMP], "time": ""}, {"lamp_dim": {"level": 3}})
REPEAT = ("normal_atom_enum", {"id": "normal_atom_enum_1", "question": "user: Dim the lamp to 5 percent.\n",
                               "function": [LAMP], "time": ""}, {"lamp_dim": {"level": 5}})


def stage_config(tmp_path, *overrides):
    return compose(["experiment=bfcl", "profile=toy", f"experiment.run_root={tmp_path / 'runs'}",
                    "logging.progress=false", *overrides])


def test_acebench_folder_through_the_data_stage(tmp_path):
    write_acebench(tmp_path / "acebench", [BROKEN, REPEAT])
    cfg = stage_config(tmp_path, f"data.path={tmp_path / 'acebench'}", "data.invalid_rows=skip")
    manifest = prepare.run(cfg)
    assert manifest.status == "complete"
    rows = pq.read_table(data_dir(cfg) / "sft.parquet").to_pylist()
    assert tuple(rows[0]) == TOOL_PARQUET_COLUMNS
    assert len(rows) == len(ACEBENCH_SINGLE_TURN) + 1 and {r["source"] for r in rows} == {"acebench"}
    details = manifest.details
    assert details["source"]["kind"] == "acebench_local" and len(details["source"]["sha256"]) == 64
    assert details["invalid_rows"] == {"policy": "skip", "count": 1, "by_field": {"question": 1},
                                       "first": [{"row": "normal_atom_bool_1", "field": "question",
                                                  "reason": details["invalid_rows"]["first"][0]["reason"]}]}
    assert details["num_source_rows"] == len(ACEBENCH_SINGLE_TURN) + 2
    assert details["duplicates"]["problems"]["duplicate_rows"] == 1  # normal_atom_enum_1 repeats the 5 % request
    assert details["duplicates"]["ids"]["duplicate_rows"] == 0
    assert details["split"]["counts"] == {"sft": len(rows)} and details["split"]["rows_dropped_by_cap"] == 0
    assert details["benchmarks"]["live_simple"] == {"kind": "bfcl", "expected_count": 258}
    assert manifest.metrics["num_sft_rows"] == len(rows)
    assert not (data_dir(cfg) / "rl.parquet").exists()


def test_invalid_acebench_row_is_an_error_by_default(tmp_path):
    write_acebench(tmp_path / "acebench", [BROKEN])
    with pytest.raises(InvalidToolRowError, match="normal_atom_bool_1.*'question'"):
        prepare.run(stage_config(tmp_path, f"data.path={tmp_path / 'acebench'}"))


def test_duplicates_refused_on_request(tmp_path):
    write_acebench(tmp_path / "acebench", [REPEAT])
    with pytest.raises(ValueError, match="data.duplicates=refuse"):
        prepare.run(stage_config(tmp_path, f"data.path={tmp_path / 'acebench'}", "data.duplicates=refuse"))


def test_synthetic_rows_capped_and_tokenised_with_the_tool_template(tmp_path):
    cfg = stage_config(tmp_path, "data=synthetic_tools", "data.num_sft_rows=12", "data.max_length=4096")
    manifest = prepare.run(cfg)
    rows = pq.read_table(data_dir(cfg) / "sft.parquet").to_pylist()
    assert len(rows) == 12 and manifest.details["source"]["kind"] == "synthetic_tools"
    assert manifest.details["categories"] == {"irrelevance": 2, "multiple": 3, "parallel": 2,
                                              "parallel_multiple": 2, "simple": 3}
    assert prepare.run(cfg).details == manifest.details  # a complete run is skipped, same record

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = cfg.data.tool_chat_template()
    assert tokenizer.chat_template == CHATML_TOOLS_TEMPLATE
    columns, too_long = tokenise_rows(cfg, tokenizer, rows, "SFT")
    assert too_long == [] and columns["row_id"] == [r["row_id"] for r in rows]
    for ids, labels, row in zip(columns["input_ids"], columns["labels"], rows):
        prompt_len = labels.count(IGNORE_INDEX)
        assert labels[prompt_len:] == ids[prompt_len:] and labels[:prompt_len] == [IGNORE_INDEX] * prompt_len
        supervised = tokenizer.decode(ids[prompt_len:])
        calls = json.loads(row["calls"])
        assert supervised.count("<tool_call>") == len(calls)
        assert all(f'"name": "{c["name"]}"' in supervised for c in calls)
        assert supervised.endswith("<|im_end|>")
