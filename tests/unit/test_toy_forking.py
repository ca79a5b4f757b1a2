"""The forking toy world: hand-checked strategy texts, each strategy's reliability per family, the narrow teacher,
determinism by seed, the ``toy.world`` dispatch, and the entropy-profile helpers."""
from __future__ import annotations

import itertools
import math
import re
from collections import Counter

import pytest
import torch

from common.config import ConfigError
from common.config.toy import (FORK_BEST_STRATEGY, FORK_FAMILIES, FORK_OPENINGS, FORK_STRATEGIES, FORKING_FIELDS,
                               MID_RESPONSE_PREFIX, ToyConfig, fork_prefix)
from toy import forking, worlds
from common.forks import token_entropy
from toy.entropy import classify_tokens, fork_token_index
from toy.forking import Problem, family_problems, is_reliable, solve, strategy_answer
from toy.pretrain import boxed_integer
from toy.tokenizer import train_tokenizer

TEACHER = ToyConfig().fork_teacher_weights
VERIFIED_TEACHER = {"place": 0.8, "column": 0.1, "round": 0.1}  # the first measurement's teacher
MIX = forking.ForkingMix(chat_ratio=0.5, best_share=0.5)


def _problem_of(row: dict) -> Problem:
    a, b = re.search(r"(\d+) \+ (\d+)", row["prompt"][1]["content"]).groups()
    return Problem(int(a), int(b))


def test_solution_texts_by_hand():
    small_carry = Problem(45, 38)  # 83: the ones carry
    assert solve(small_carry, "column") == ("Column: 5 + 8 = 13, write 3 carry 1. 4 + 3 + 1 = 8, write 8. "
                                            "The answer is \\boxed{83}.")
    assert solve(small_carry, "place") == "Place value: 4 + 3 = 7. 5 + 8 = 13. The answer is \\boxed{713}."
    assert solve(small_carry, "round") == "Round: 38 = 40 - 2. 4 + 4 = 8. 5 - 2 = 3. The answer is \\boxed{83}."
    small_plain = Problem(41, 38)  # 79: no carry; round takes the smaller ones digit from the larger
    assert solve(small_plain, "round") == "Round: 38 = 40 - 2. 4 + 4 = 8. 2 - 1 = 1. The answer is \\boxed{81}."
    assert solve(small_plain, "column") == ("Column: 1 + 8 = 9, write 9 carry 0. 4 + 3 + 0 = 7, write 7. "
                                            "The answer is \\boxed{79}.")
    overflow = Problem(75, 48)  # 123: column drops the final carry
    assert solve(overflow, "column").endswith("7 + 4 + 1 = 12, write 2. The answer is \\boxed{23}.")
    assert solve(overflow, "round") == "Round: 48 = 50 - 2. 7 + 5 = 12. 5 - 2 = 3. The answer is \\boxed{123}."
    assert solve(Problem(72, 45), "place") == "Place value: 7 + 4 = 11. 2 + 5 = 7. The answer is \\boxed{117}."
    assert solve(Problem(55, 45), "column").endswith("\\boxed{00}.")  # 100: both carries dropped, digits as written


@pytest.mark.parametrize("problem, family", [(Problem(45, 38), "small"), (Problem(41, 38), "small"),
                                             (Problem(75, 48), "carry"), (Problem(72, 45), "plain"),
                                             (Problem(50, 49), "small"), (Problem(51, 49), "carry")])
def test_families(problem, family):
    assert problem.family == family


def test_each_strategy_is_right_exactly_where_documented():
    for family in FORK_FAMILIES:
        for problem in family_problems(family, False) + family_problems(family, True):
            carry = problem.a % 10 + problem.b % 10 >= 10
            assert is_reliable(problem, "column") == (family == "small")
            assert is_reliable(problem, "place") == (not carry)
            assert is_reliable(problem, "round") == carry
            assert boxed_integer(solve(problem, FORK_BEST_STRATEGY[family])) == problem.answer
            for strategy in FORK_STRATEGIES:
                assert boxed_integer(solve(problem, strategy)) == strategy_answer(problem, strategy)


def test_documented_failures():
    assert strategy_answer(Problem(75, 48), "column") == 23  # final carry dropped
    assert strategy_answer(Problem(45, 38), "place") == 713  # place sums side by side
    assert strategy_answer(Problem(41, 38), "round") == 81  # 2 - 1 instead of a borrow


def test_families_partition_the_problems_and_hold_enough_held_out():
    sizes = {family: (len(family_problems(family, False)), len(family_problems(family, True)))
             for family in FORK_FAMILIES}
    assert sum(train + held for train, held in sizes.values()) == 90 * 72  # a 10-99, b 11-89 not a multiple of 10
    assert all(held >= 100 for _, held in sizes.values())
    assert all(p.held_out for family in FORK_FAMILIES for p in family_problems(family, True))


def _row_counts(rows: list[dict]) -> Counter:
    """(family, strategy) -> rows, after checking that rows hold distinct trainable problems with the true sum."""
    assert len({row["prompt"][1]["content"] for row in rows}) == len(rows)
    assert not any(_problem_of(row).held_out for row in rows)
    assert all(int(row["reward_model"]["ground_truth"]) == _problem_of(row).answer for row in rows)
    return Counter((_problem_of(row).family, forking.solution_strategy(row["target"][0]["content"])) for row in rows)


def test_default_teacher_is_narrow_on_every_family_and_keeps_its_wrong_answers():
    rows = forking.teacher_rows(900, 0, TEACHER, verified=False)
    counts = _row_counts(rows)
    assert {family: sum(n for (f, _), n in counts.items() if f == family) for family in FORK_FAMILIES} == \
        {family: 300 for family in FORK_FAMILIES}
    for family in FORK_FAMILIES:
        assert counts[(family, "place")] / 300 >= 0.85 and counts[(family, "round")] == 0
    assert not any(is_reliable(_problem_of(row), forking.solution_strategy(row["target"][0]["content"]))
                   for row in rows if _problem_of(row).family == "carry")  # the teacher never solves carry
    assert all(boxed_integer(row["target"][0]["content"]) == strategy_answer(
        _problem_of(row), forking.solution_strategy(row["target"][0]["content"])) for row in rows)


def test_verified_teacher_keeps_only_right_answers_which_makes_each_family_right_conditionally():
    rows = forking.teacher_rows(900, 0, VERIFIED_TEACHER, verified=True)
    counts = _row_counts(rows)
    assert all(boxed_integer(row["target"][0]["content"]) == _problem_of(row).answer for row in rows)
    assert sum(n for (_, strategy), n in counts.items() if strategy == "place") / len(rows) >= 0.75
    small = sum(n for (family, _), n in counts.items() if family == "small")
    assert counts[("small", "place")] / small >= 0.6  # place where column is always right
    assert set(s for (family, s) in counts if family == "carry") == {"round"}


def test_a_teacher_that_cannot_fill_the_rows_names_the_setting():
    with pytest.raises(ValueError, match="toy.num_rows=6000"):
        forking.teacher_rows(6000, 0, {"column": 1.0}, verified=True)
    with pytest.raises(ValueError, match="toy.num_rows=6000.*verified=False"):
        forking.teacher_rows(6000, 0, TEACHER, verified=False)  # 6000 attempts need 2000 per family


def test_deterministic_by_seed():
    assert forking.teacher_rows(60, 3, TEACHER, False) == forking.teacher_rows(60, 3, TEACHER, False)
    assert forking.teacher_rows(60, 3, TEACHER, False) != forking.teacher_rows(60, 4, TEACHER, False)
    first = list(itertools.islice(forking.documents(5, MIX), 50))
    assert first == list(itertools.islice(forking.documents(5, MIX), 50))
    assert first != list(itertools.islice(forking.documents(6, MIX), 50))
    assert forking.benchmark_problems("carry", 20, 1) == forking.benchmark_problems("carry", 20, 1)


def test_documents_use_every_strategy_on_every_family_and_never_a_held_out_problem():
    held_out = {p.expression for family in FORK_FAMILIES for p in family_problems(family, True)}
    seen = Counter()
    for document in itertools.islice(forking.documents(0, MIX), 3000):
        expression = re.search(r"(\d+ \+ \d+)", document).group(1)
        assert expression not in held_out
        answer = document.split("Answer: ")[-1].split("<|im_start|>assistant\n")[-1]
        seen[(Problem(*map(int, expression.split(" + "))).family, forking.solution_strategy(answer))] += 1
    assert set(seen) == set(itertools.product(FORK_FAMILIES, FORK_STRATEGIES))
    for family in FORK_FAMILIES:
        total = sum(n for (f, _), n in seen.items() if f == family)
        assert seen[(family, FORK_BEST_STRATEGY[family])] / total == pytest.approx(0.5, abs=0.06)


def test_strategy_recognition():
    problem = Problem(45, 38)
    assert [forking.solution_strategy(solve(problem, s)) for s in FORK_STRATEGIES] == list(FORK_STRATEGIES)
    assert forking.solution_strategy("The answer is \\boxed{83}.") is None


def test_the_fork_is_the_first_response_token():
    tokenizer = train_tokenizer(itertools.islice(forking.documents(0, MIX), 400), 512)
    firsts = {s: tokenizer.encode(solve(Problem(45, 38), s), add_special_tokens=False)[0] for s in FORK_STRATEGIES}
    assert len(set(firsts.values())) == len(FORK_STRATEGIES)
    # common.forks reads the fork from each opening's first token alone: the same token as the solution's
    assert {s: tokenizer.encode(FORK_OPENINGS[s], add_special_tokens=False)[0] for s in FORK_STRATEGIES} == firsts
    assert len(tokenizer.encode("\n", add_special_tokens=False)) == 1


def test_world_dispatch_and_benchmarks():
    forking_toy = ToyConfig(world="forking")
    assert worlds.benchmark_names(forking_toy) == ("toy_fork_small", "toy_fork_carry", "toy_fork_plain")
    assert worlds.benchmark_names(ToyConfig()) == ("toy_add", "toy_mixed")
    problems = worlds.benchmark_problems(forking_toy, "toy_fork_plain", 30, 7)
    assert len(problems) == 30 and all(p.family == "plain" and p.held_out for p in problems)
    with pytest.raises(ConfigError, match="data.benchmarks.toy_add"):
        worlds.benchmark_problems(forking_toy, "toy_add", 10, 0)
    assert Counter(p.family for p in worlds.health_check_problems(forking_toy, 7, 0)) == \
        {"small": 3, "carry": 2, "plain": 2}


def test_config_world_and_base_model_key():
    with pytest.raises(ConfigError, match="toy.world"):
        ToyConfig(world="geometry").validate()
    with pytest.raises(ConfigError, match="toy.fork_teacher_weights"):
        ToyConfig(world="forking", fork_teacher_weights={"guess": 1.0}).validate()
    arithmetic = ToyConfig().base_model_settings()
    assert not set(FORKING_FIELDS) & set(arithmetic)  # the arithmetic world's cache key is what it was
    forking_key = ToyConfig(world="forking").base_model_settings()
    assert forking_key["world"] == "forking"
    assert not {"fork_teacher_weights", "fork_teacher_verified"} & set(forking_key)  # rows only: same base model


def test_token_classes_and_entropy_by_hand():
    digit_ids = torch.tensor([False, False, False, True, True])  # ids 3 and 4 are digits, 2 is eos
    tokens = torch.tensor([[3, 4, 1, 2, 4], [1, 3, 2, 0, 0]])
    assert classify_tokens(tokens, digit_ids, eos_id=2).tolist() == [[0, 1, 2, 2, -1], [0, 1, 2, -1, -1]]
    uniform, certain = torch.zeros(4), torch.tensor([0.0, -1e4, -1e4, -1e4])
    assert token_entropy(torch.stack([uniform, certain])).tolist() == pytest.approx([math.log(4), 0.0], abs=1e-6)


def test_the_mid_response_world_forks_after_a_fixed_prefix():
    prefix = fork_prefix("mid")
    assert prefix == MID_RESPONSE_PREFIX and fork_prefix("first") == ""
    mix = forking.ForkingMix(chat_ratio=0.5, best_share=0.5, prefix=prefix)
    tokenizer = train_tokenizer(itertools.islice(forking.documents(0, mix), 400), 512)
    encoded = [tokenizer.encode(solve(Problem(45, 38), s, prefix), add_special_tokens=False) for s in FORK_STRATEGIES]
    fork = fork_token_index(tokenizer, ToyConfig(world="forking", fork_position="mid"))  # the space joins the fork
    assert fork >= 2 and len({tuple(ids[:fork]) for ids in encoded}) == 1  # the prefix: the same tokens every time
    assert len({ids[fork] for ids in encoded}) == len(FORK_STRATEGIES)      # then the fork
    rows = forking.teacher_rows(20, 0, TEACHER, verified=False, prefix=prefix)
    assert all(row["target"][0]["content"].startswith(prefix) for row in rows)
    assert all(forking.solution_strategy(row["target"][0]["content"]) == "place" or
               forking.solution_strategy(row["target"][0]["content"]) == "column" for row in rows)
    assert all(row["behaviour_logprobs"][0] == {"text": prefix, "logprob": 0.0} for row in rows)


def test_the_base_not_optimal_world_prefers_the_strategy_right_least_often():
    for family in FORK_FAMILIES:
        right = {s: sum(is_reliable(p, s) for p in family_problems(family, False)) for s in FORK_STRATEGIES}
        assert forking.WORST_STRATEGY[family] == min(FORK_STRATEGIES, key=lambda s: right[s])  # ties: the first
    weights = forking.document_weights(0.5, "worst")
    assert weights["carry"] == {"column": 0.5, "place": 0.25, "round": 0.25}
    assert forking.document_weights(0.5) == forking.document_weights(0.5, "best")


def test_the_two_worlds_are_one_key_each_and_change_the_base_model_key():
    default = ToyConfig(world="forking").base_model_settings()
    assert "fork_position" not in default and "fork_base_prefers" not in default  # today's cache key
    for key, value in (("fork_position", "mid"), ("fork_base_prefers", "worst")):
        assert ToyConfig(world="forking", **{key: value}).base_model_settings()[key] == value
    with pytest.raises(ConfigError, match="toy.fork_position"):
        ToyConfig(world="forking", fork_position="last").validate()
    with pytest.raises(ConfigError, match="toy.fork_base_prefers"):
        ToyConfig(world="forking", fork_base_prefers="random").validate()
