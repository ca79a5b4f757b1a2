"""The SFT / RL split: deterministic by split_seed, disjoint by problem, duplicates kept together."""
from __future__ import annotations

import hashlib

import pytest

from common.errors import ConfigError
from data.split import ids_digest, split_rows

PROBLEMS = [f"What is {i} + {i + 1}?" for i in range(40)]


def split(problems, seed, num_sft=10, num_rl=-1, num_val=0):
    return split_rows(problems, num_sft_rows=num_sft, num_rl_rows=num_rl, num_rl_val_rows=num_val, split_seed=seed)


def test_same_seed_same_ids_and_different_seed_different_ids():
    first, again, other = split(PROBLEMS, 1), split(PROBLEMS, 1), split(PROBLEMS, 2)
    assert (first.sft, first.rl) == (again.sft, again.rl)
    assert sorted(first.sft) != sorted(other.sft)


def test_parts_are_disjoint_and_cover_every_row():
    parts = split(PROBLEMS, 7, num_sft=10, num_val=5)
    assert (len(parts.sft), len(parts.rl_val), len(parts.rl)) == (10, 5, 25)
    everything = parts.sft + parts.rl + parts.rl_val
    assert sorted(everything) == list(range(40))


def test_duplicates_of_a_problem_never_straddle_the_split():
    # rows 0..9 are one problem written ten ways (case, spacing): one group of 10 rows
    problems = [("  what IS 1 +  2?" if i % 2 else "What is 1 + 2?") for i in range(10)] + PROBLEMS[3:33]
    for seed in range(20):
        parts = split(problems, seed, num_sft=12)
        in_sft = {p < 10 for p in parts.sft}
        in_rl = {p < 10 for p in parts.rl}
        assert not (True in in_sft and True in in_rl)
        assert len(parts.sft) == 12  # smaller groups fill SFT exactly


def test_rl_cap_counts_what_it_drops():
    parts = split(PROBLEMS, 3, num_sft=10, num_rl=20)
    assert (len(parts.rl), parts.num_rl_capped) == (20, 10)


def test_too_few_rows_is_an_error_naming_the_key_and_the_fix():
    # Issue 39, item 4: a ValueError, so the data stage printed 17 lines of traceback above this message.
    with pytest.raises(ConfigError, match="num_sft_rows=40 leaves no RL rows.*fix: set data.num_sft_rows below"):
        split(PROBLEMS, 0, num_sft=40)


def test_ids_digest_is_sha256_of_sorted_ids():
    assert ids_digest([3, 1, 2]) == hashlib.sha256(b"1,2,3").hexdigest()
