"""The AceBench loader (local files in the original layout, the hub copy's JSON-text encoding), the tool-calling
template round trip (prompt masked, call tokens supervised) and the synthetic tool-use set."""
from __future__ import annotations

import json

import pytest

from bench.tiny_model import build_tiny_tokenizer
from data.formatting import IGNORE_INDEX
from common.config.data import CHATML_TOOLS_TEMPLATE
from data.tool_use import (SYNTHETIC_CATEGORIES, SYNTHETIC_FUNCTIONS, SYNTHETIC_REFUSAL,
                           InvalidToolRowError, acebench_row, acebench_rows, build_tool_sft_example,
                           load_acebench_local, synthetic_tool_rows)


KETTLE = {"name": "kettle_boil", "description": "Boil water in a smart kettle.",
          "parameters": {"type": "object", "properties": {"litres": {"type": "number", "description": "Volume."},
                                                          "tea": {"type": "string", "description": "Tea kind."}},
                         "required": ["litres"]}}
LAMP = {"name": "lamp_dim", "description": "Dim a lamp.",
        "parameters": {"type": "object", "properties": {"level": {"type": "integer", "description": "Percent."}},
                       "required": ["level"]}}
ROWS = {
    "normal_single_turn_single_function": [
        {"id": "normal_single_turn_single_function_0", "question": "user: Boil 1.5 litres for green tea.\n",
         "function": [KETTLE, LAMP], "time": "The current time is May 3, 2024."}],
    "normal_single_turn_parallel_function": [
        {"id": "normal_single_turn_parallel_function_0",
         "question": "user: Dim the lamp to 30 and then to 10 percent.\n", "function": [LAMP], "time": ""}],
    "special_irrelevant": [
        {"id": "special_irrelevant_0", "question": "user: Book me a flight to Oslo.\n", "function": [KETTLE],
         "time": ""}],
}
ANSWERS = {
    "normal_single_turn_single_function": [{"id": "normal_single_turn_single_function_0",
                                            "ground_truth": {"kettle_boil": {"litres": 1.5, "tea": "green"}}}],
    "normal_single_turn_parallel_function": [{"id": "normal_single_turn_parallel_function_0",
                                              "ground_truth": {"lamp_dim_1": {"level": 30},
                                                               "lamp_dim_2": {"level": 10}}}],
    "special_irrelevant": [{"id": "special_irrelevant_0",
                            "ground_truth": "Due to the limitations of the function, I cannot solve this problem."}],
}
CATEGORIES = tuple(ROWS)


@pytest.fixture(scope="module")
def acebench_dir(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("acebench")
    (tmp_path / "possible_answer").mkdir()
    for category, rows in ROWS.items():
        (tmp_path / f"data_{category}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (tmp_path / "possible_answer" / f"data_{category}.json").write_text(
            "".join(json.dumps(a) + "\n" for a in ANSWERS[category]))
    return tmp_path


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tiny_tokenizer()
    tok.chat_template = CHATML_TOOLS_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def loaded(acebench_dir):
    return load_acebench_local(acebench_dir, CATEGORIES)


def test_local_acebench_rows(loaded):
    rows, skipped = loaded
    assert skipped == {}
    by_id = {r["id"]: r for r in rows}
    single = by_id["normal_single_turn_single_function_0"]
    assert single["messages"] == [{"role": "system", "content": "The current time is May 3, 2024."},
                                  {"role": "user", "content": "Boil 1.5 litres for green tea."}]
    assert json.loads(single["calls"]) == [{"name": "kettle_boil", "arguments": {"litres": 1.5, "tea": "green"}}]
    assert [f["name"] for f in json.loads(single["tools"])] == ["kettle_boil", "lamp_dim"]
    parallel = by_id["normal_single_turn_parallel_function_0"]
    assert parallel["messages"] == [{"role": "user", "content": "Dim the lamp to 30 and then to 10 percent."}]
    assert json.loads(parallel["calls"]) == [{"name": "lamp_dim", "arguments": {"level": 30}},
                                             {"name": "lamp_dim", "arguments": {"level": 10}}]
    irrelevant = by_id["special_irrelevant_0"]
    assert json.loads(irrelevant["calls"]) == []
    assert irrelevant["reply"] == "Due to the limitations of the function, I cannot solve this problem."


def test_hub_encoding_gives_the_same_rows(loaded):
    local, _ = loaded
    hub_rows = [{**row, "function": json.dumps(row["function"]), "sub_category": category,
                 "rubric": answer["ground_truth"] if isinstance(answer["ground_truth"], str)
                 else json.dumps(answer["ground_truth"])}
                for category in CATEGORIES for row, answer in zip(ROWS[category], ANSWERS[category])]
    hub_rows.append({"id": "agent_multi_turn_0", "sub_category": "agent_multi_turn", "question": "user: hi",
                     "function": "[]", "rubric": "{}"})
    hub, skipped = acebench_rows(hub_rows)
    assert sorted(hub, key=lambda r: r["id"]) == sorted(local, key=lambda r: r["id"])
    assert skipped == {"category agent_multi_turn": 1}


def test_invalid_rows_name_the_field():
    row = {"id": "normal_atom_bool_1", "question": "user: Dim it.\nsystem: [lamp_dim(level=3)]\nuser: Again.",
           "function": [LAMP], "time": ""}
    with pytest.raises(InvalidToolRowError, match="'question'"):
        acebench_row(row, {"lamp_dim": {"level": 3}}, "normal_atom_bool")
    with pytest.raises(InvalidToolRowError, match="'ground_truth'.*'kettle_boil'"):
        acebench_row({**row, "question": "user: Dim it."}, {"kettle_boil": {"litres": 1}}, "normal_atom_bool")


def _supervised_text(tokenizer, example):
    ids = [t for t, label in zip(example.input_ids, example.labels) if label != IGNORE_INDEX]
    return tokenizer.decode(ids)


def test_template_round_trip_masks_the_prompt_and_supervises_the_calls(tokenizer, loaded):
    rows, _ = loaded
    by_id = {r["id"]: r for r in rows}
    example = build_tool_sft_example(tokenizer, by_id["normal_single_turn_parallel_function_0"], max_length=4096)
    prompt_len = example.labels.count(IGNORE_INDEX)
    assert example.labels[:prompt_len] == [IGNORE_INDEX] * prompt_len
    assert example.labels[prompt_len:] == example.input_ids[prompt_len:]
    prompt = tokenizer.decode(example.input_ids[:prompt_len])
    assert prompt.startswith("<|im_start|>system\n# Tools\n<tools>\n{\"name\": \"lamp_dim\", \"description\"")
    assert prompt.endswith("<|im_start|>user\nDim the lamp to 30 and then to 10 percent.<|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert _supervised_text(tokenizer, example) == (
        '<tool_call>\n{"name": "lamp_dim", "arguments": {"level": 30}}\n</tool_call>\n'
        '<tool_call>\n{"name": "lamp_dim", "arguments": {"level": 10}}\n</tool_call><|im_end|>')
    assert example.num_response_tokens == len(example.input_ids) - prompt_len and not example.truncated

    refusal = build_tool_sft_example(tokenizer, by_id["special_irrelevant_0"], max_length=4096)
    assert _supervised_text(tokenizer, refusal) == \
        "Due to the limitations of the function, I cannot solve this problem.<|im_end|>"


def test_round_trip_truncates_the_response_to_max_length(tokenizer, loaded):
    rows, _ = loaded
    row = next(r for r in rows if r["id"] == "normal_single_turn_single_function_0")
    full = build_tool_sft_example(tokenizer, row, max_length=4096)
    prompt_len = full.labels.count(IGNORE_INDEX)
    cut = build_tool_sft_example(tokenizer, row, max_length=prompt_len + 3)
    assert cut.truncated and cut.num_response_tokens == 3 and cut.input_ids == full.input_ids[:prompt_len + 3]


def test_synthetic_set_is_seeded_and_well_formed():
    rows = synthetic_tool_rows(50, seed=7)
    assert rows == synthetic_tool_rows(50, seed=7) and rows != synthetic_tool_rows(50, seed=8)
    assert [r["category"] for r in rows[:5]] == list(SYNTHETIC_CATEGORIES)
    for row in rows:
        offered = {f["name"] for f in json.loads(row["tools"])}
        calls = json.loads(row["calls"])
        expected_calls = {"simple": 1, "multiple": 1, "parallel": 2, "parallel_multiple": 2, "irrelevance": 0}
        assert len(calls) == expected_calls[row["category"]]
        assert all(c["name"] in offered for c in calls)
        assert all(set(c["arguments"]) >= set(SYNTHETIC_FUNCTIONS[c["name"]]["parameters"]["required"])
                   for c in calls)
        assert json.loads(row["possible_answer"]) == [{c["name"]: {k: [v] for k, v in c["arguments"].items()}}
                                                      for c in calls]
        assert row["reply"] == ("" if calls else SYNTHETIC_REFUSAL)
    parallel_multiple = [json.loads(r["calls"]) for r in rows if r["category"] == "parallel_multiple"]
    assert all(len({c["name"] for c in calls}) == 2 for calls in parallel_multiple)
