"""BFCL scoring: the accuracy definitions on hand-counted verdicts, and BFCL's own checker (run in the BFCL venv,
``make bfcl-env``) on hand-made right / wrong / irrelevant outputs for real entries of each live category.

The checker tests skip when the BFCL venv is absent; CI builds it with ``make bfcl-env`` (docs/tool_use.md)."""
from __future__ import annotations

import json
import math

import pytest

from eval.bfcl.checker import (BfclChecker, BfclUnavailableError, CategoryScore, category_scores, live_overall,
                                prompt_of, summary)


def test_category_scores_count_each_category():
    scores = category_scores([("live_simple", True), ("live_simple", False), ("live_multiple", True),
                              ("live_irrelevance", True), ("live_irrelevance", True), ("live_irrelevance", False)])
    assert scores == {"live_simple": CategoryScore(1, 2), "live_multiple": CategoryScore(1, 1),
                      "live_irrelevance": CategoryScore(2, 3)}
    assert scores["live_irrelevance"].accuracy == pytest.approx(2 / 3)
    assert math.isnan(CategoryScore(0, 0).accuracy)


def test_live_overall_is_count_weighted_over_the_live_ast_categories():
    # BFCL's calculate_weighted_accuracy: (0.5*258 + 0.8*1053 + 0.25*16 + 0.5*24) / (258+1053+16+24)
    scores = {"live_simple": CategoryScore(129, 258), "live_multiple": CategoryScore(842, 1053),
              "live_parallel": CategoryScore(4, 16), "live_parallel_multiple": CategoryScore(12, 24),
              "live_irrelevance": CategoryScore(884, 884)}
    overall = live_overall(scores)
    assert (overall.correct, overall.total) == (987, 1351)
    assert overall.accuracy == pytest.approx((0.5 * 258 + 842 + 0.25 * 16 + 0.5 * 24) / 1351)
    # not the unweighted mean of the four categories (BFCL's non-live summary uses that one)
    assert overall.accuracy != pytest.approx((0.5 + 842 / 1053 + 0.25 + 0.5) / 4)
    table = summary(scores)
    assert table["bfcl_live"] == pytest.approx(100 * 987 / 1351)
    assert table["irrelevance_detection"] == 100.0 and table["irrelevance_set"] == "live_irrelevance"
    assert table["categories"]["live_parallel"] == {"accuracy": 25.0, "correct": 4, "total": 16}


def test_prompt_of_keeps_the_first_turn_and_the_raw_function_documents():
    function = {"name": "lamp.dim", "description": "Dim a lamp.",
                "parameters": {"type": "dict", "properties": {"level": {"type": "integer"}}, "required": ["level"]}}
    entry = {"id": "live_simple_9-9-9", "question": [[{"role": "system", "content": "Be brief."},
                                                      {"role": "user", "content": "Dim it to 3."}]],
             "function": [function]}
    assert prompt_of(entry) == ([{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Dim it to 3."}], [function])
    with pytest.raises(ValueError, match="2 turns"):
        prompt_of({**entry, "question": entry["question"] * 2})


def test_missing_checker_venv_names_the_make_target(tmp_path):
    with pytest.raises(BfclUnavailableError, match="make bfcl-env"):
        BfclChecker(python=tmp_path / "no-venv" / "bin" / "python")


def _call(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# Real BFCL v4 live entries (bfcl-eval 2026.3.23) and outputs written by hand for them.
LIVE_CASES = [
    ("live_simple", "live_simple_0-0-0",
     _call("get_user_info", {"user_id": 7890, "special": "black"}),
     [_call("get_user_info", {"user_id": 7891, "special": "black"}),      # wrong value
      _call("get_user_info", {"user_id": "7890", "special": "black"}),    # wrong type
      "The user 7890 has a black special request."]),                     # no call
    ("live_multiple", "live_multiple_1-0-1",
     _call("ChaDri.change_drink", {"drink_id": "1234", "new_preferences": {"sweetness_level": "none",
                                                                           "temperature": "hot"}}),
     [_call("ChaFod", {"TheFod": "COFFEE"}),                                # wrong function
      _call("ChaDri.change_drink", {"drink_id": "1234", "new_preferences": {"sweetness_level": "none",
                                                                            "temperature": "cold"}})]),
    ("live_parallel", "live_parallel_0-0-0",
     _call("get_current_weather", {"location": "Shanghai, China"}) + "\n"
     + _call("get_current_weather", {"location": "Beijing, China"}),       # order-free
     [_call("get_current_weather", {"location": "Beijing, China"}),        # one of two calls
      _call("get_current_weather", {"location": "Beijing, China"}) + "\n"
      + _call("get_current_weather", {"location": "Shanghai, China", "unit": "celsius"})]),
    ("live_parallel_multiple", "live_parallel_multiple_1-1-0",
     _call("get_current_weather", {"location": "Guangzhou, China", "unit": "metric"}) + "\n"
     + _call("get_current_weather", {"location": "Beijing, China", "unit": "metric"}),
     [_call("get_current_weather", {"location": "Guangzhou, China", "unit": "metric"}) + "\n"
      + _call("generate_password", {"length": 8})]),
]


@pytest.mark.parametrize("category, entry_id, right, wrongs", LIVE_CASES, ids=[c[0] for c in LIVE_CASES])
def test_bfcl_checker_on_live_categories(checker, category, entry_id, right, wrongs):
    assert checker.check(category, entry_id, right).valid
    assert checker.check(category, entry_id, "<think>\nweighing the options\n</think>\n\n" + right).valid
    for wrong in wrongs:
        verdict = checker.check(category, entry_id, wrong)
        assert not verdict.valid and verdict.error_type


@pytest.mark.parametrize("category, entry_id", [("live_irrelevance", "live_irrelevance_0-0-0"),
                                                ("irrelevance", "irrelevance_1")])
def test_bfcl_checker_on_irrelevance(checker, category, entry_id):
    assert checker.check(category, entry_id, "None of the functions can answer this.").valid
    assert checker.check(category, entry_id, "").valid
    verdict = checker.check(category, entry_id, _call("requests.get", {"url": "https://example.com"}))
    assert not verdict.valid and verdict.error_type == "irrelevance_error:decoder_success"


def test_bfcl_checker_on_an_entry_outside_its_files(checker):
    function = [{"name": "paint_needed", "description": "Litres of paint.",
                 "parameters": {"type": "dict", "required": ["wall_m2", "coats"],
                                "properties": {"wall_m2": {"type": "float", "description": "Area."},
                                               "coats": {"type": "integer", "description": "Coats."}}}}]
    truth = [{"paint_needed": {"wall_m2": [12.5], "coats": [2]}}]
    assert checker.check("simple", "synthetic-0", _call("paint_needed", {"wall_m2": 12.5, "coats": 2}),
                         function=function, ground_truth=truth).valid
    assert not checker.check("simple", "synthetic-0", _call("paint_needed", {"wall_m2": 12.5, "coats": 3}),
                             function=function, ground_truth=truth).valid


def test_bfcl_category_counts(checker):
    counts = {c: len(checker.entries(c)) for c in ("live_simple", "live_multiple", "live_parallel",
                                                    "live_parallel_multiple", "live_irrelevance", "irrelevance")}
    assert counts == {"live_simple": 258, "live_multiple": 1053, "live_parallel": 16, "live_parallel_multiple": 24,
                      "live_irrelevance": 884, "irrelevance": 240}
