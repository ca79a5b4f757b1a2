"""The toy world: hand-checked reductions and solution texts, held-out problems, tokenizer properties."""
from __future__ import annotations

import itertools
import random

import pytest

from data.schema import check_row
from toy.pretrain import boxed_integer, learning_rate
from toy.tokenizer import train_tokenizer
from toy.arithmetic import (DocumentMix, Problem, Term, benchmark_problems, chat_text, documents, reduce_problem,
                       solution_style, solve, training_rows)

# 3 - 7 * 4 + (9 - 2) * 5 = 3 - 28 + 35 = 10
PROBLEM = Problem((Term("number", (3,)), Term("product", (7, 4)), Term("group", (9, 2, 5), "-")), ("-", "+"))
MIX = DocumentMix(0.5, {"chain": 0.4, "steps": 0.3, "careful": 0.15, "direct": 0.15},
                  {"chain": 0.35, "steps": 0.25, "careful": 0.05, "direct": 0.35},
                  {"chain": 0.3, "steps": 0.3, "careful": 0.0}, 0.8, 2, 4)


def test_reduction_order_and_values():
    steps = [(s.left, s.op, s.right, s.result) for s in reduce_problem(PROBLEM)]
    assert steps == [(7, "*", 4, 28), (9, "-", 2, 7), (7, "*", 5, 35), (3, "-", 28, -25), (-25, "+", 35, 10)]
    assert PROBLEM.expression == "3 - 7 * 4 + (9 - 2) * 5" and PROBLEM.answer == 10


def test_solution_texts():
    rng = random.Random(0)
    assert solve(PROBLEM, "chain", rng) == ("3 - 7 * 4 + (9 - 2) * 5 = 3 - 28 + (9 - 2) * 5 = 3 - 28 + 7 * 5 = "
                                           "3 - 28 + 35 = -25 + 35 = 10. The answer is \\boxed{10}.")
    assert solve(PROBLEM, "steps", rng) == ("7 * 4 = 28. 9 - 2 = 7. 7 * 5 = 35. 3 - 28 = -25. -25 + 35 = 10. "
                                           "The answer is \\boxed{10}.")
    careful = solve(PROBLEM, "careful", rng).split("\n")
    assert careful[1] == "7 * 4 = 28. Check: 4 * 7 = 28."
    assert careful[4] == "3 - 28 = -25. Check: -25 + 28 = 3."
    assert careful[-1] == "The answer is \\boxed{10}."


def test_slips_propagate_in_chain_but_are_corrected_in_careful():
    wrong = reduce_problem(PROBLEM, slip_step=0, slip_delta=1)  # 7 * 4 = 29
    assert [s.result for s in wrong] == [29, 7, 35, -26, 9]
    for seed in range(20):
        assert boxed_integer(solve(PROBLEM, "careful", random.Random(seed), slip_rate=1.0)) == 10
        assert boxed_integer(solve(PROBLEM, "steps", random.Random(seed), slip_rate=1.0)) != 10
    careful = solve(PROBLEM, "careful", random.Random(1), slip_rate=1.0)
    assert "No match, redo:" in careful


def test_boxed_integer_reads_the_box_the_evaluation_judges():
    assert boxed_integer("The answer is \\boxed{-12}.") == -12
    assert boxed_integer("\\boxed{3}, so \\boxed{x + 1}") is None  # the last box holds no integer
    assert boxed_integer("The answer is \\boxed {7}.") == 7  # a space before the brace, as eval.scoring allows
    assert boxed_integer("\\boxed{ 7 }") == 7
    assert boxed_integer("\\boxed{5} then \\boxed{6") == 5  # a truncated last box does not count
    assert boxed_integer("\\boxed{\\frac{1}{2}}") is None
    assert boxed_integer("no box") is None


def test_held_out_problems_never_reach_training():
    rows = training_rows(300, 0, 2, 4, {"chain": 1, "steps": 1, "careful": 1})
    held = benchmark_problems("mixed", 50, 1, 2, 4) + benchmark_problems("add", 50, 2, 2, 4)
    held_expressions = {p.expression for p in held}
    assert all(p.held_out for p in held)
    assert all(not p.is_additive for p in held[:50]) and all(p.is_additive for p in held[50:])
    for index, row in enumerate(rows):
        check_row(row, index, "toy")
        assert not any(e in row["prompt"][1]["content"] for e in held_expressions if len(e) > 12)
    docs = list(itertools.islice(documents(0, MIX), 2000))
    assert not any(f" {e}." in d or f" {e}?" in d for d in docs for e in held_expressions if len(e) > 12)


def test_styles_are_recognised():
    rng = random.Random(0)
    for style in ("chain", "steps", "careful", "direct"):
        assert solution_style(solve(PROBLEM, style, rng)) == style


def test_tokenizer_digits_newline_and_chat_template():
    tokenizer = train_tokenizer(itertools.islice(documents(0, MIX), 300), 512)
    assert tokenizer.encode("\n", add_special_tokens=False).__len__() == 1
    assert [tokenizer.decode([t]) for t in tokenizer.encode("1234", add_special_tokens=False)] == list("1234")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|pad|>"
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == chat_text(messages)
    assert tokenizer.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=False) == \
        chat_text(messages[:2]) + "<|im_start|>assistant\n"


@pytest.mark.parametrize("step, expected", [(0, 1e-3 / 30), (29, 1e-3), (30, 1e-3), (130, 1e-4)])
def test_learning_rate_schedule(step, expected):
    # warm-up 30 steps; cosine from 1e-3 at step 30 to 1e-4 (10%) at the planned last step 130
    assert learning_rate(step, 1e-3, 130) == pytest.approx(expected)
