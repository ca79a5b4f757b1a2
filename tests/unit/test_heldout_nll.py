"""The held-out NLL diagnostic: the held-out SFT slice of the split, and the NLL from per-token log-probabilities."""
from __future__ import annotations

import math

import pytest

from data.split import split_rows
from eval.heldout import heldout_nll

PROBLEMS = [f"What is {i} + {i + 1}?" for i in range(40)]


def split(seed, num_heldout, num_sft=10, num_val=5):
    return split_rows(PROBLEMS, num_sft_rows=num_sft, num_rl_rows=-1, num_rl_val_rows=num_val, split_seed=seed,
                      num_heldout_rows=num_heldout)


def test_heldout_slice_is_disjoint_from_every_other_part_and_deterministic():
    parts = split(3, 6)
    assert len(parts.heldout) == 6
    assert not set(parts.heldout) & (set(parts.sft) | set(parts.rl) | set(parts.rl_val))
    assert sorted(parts.sft + parts.heldout + parts.rl + parts.rl_val) == list(range(40))
    again = split(3, 6)
    assert (again.sft, again.heldout, again.rl, again.rl_val) == (parts.sft, parts.heldout, parts.rl, parts.rl_val)
    assert sorted(split(4, 6).heldout) != sorted(parts.heldout)


def test_heldout_slice_leaves_the_sft_rows_and_rl_validation_as_they_were():
    without, with_heldout = split(3, 0), split(3, 6)
    assert without.heldout == []
    assert with_heldout.sft == without.sft
    assert with_heldout.rl_val == without.rl_val
    # the slice is the first RL-order rows after SFT: the RL part loses exactly them
    assert with_heldout.heldout == without.rl[:6]
    assert with_heldout.rl == without.rl[6:]


def test_nll_is_the_mean_over_supervised_tokens_with_the_prompt_masked():
    # row 1: prompt [a, b], response [c, d]; row 2: prompt [a], response [b, c, d]
    logprobs = [[None, -9.0, math.log(0.5), math.log(0.25)],
                [None, math.log(0.8), -7.0, math.log(0.1)]]
    labels = [[-100, -100, 11, 12],
              [-100, 21, -100, 23]]  # a -100 inside a response (truncation never does this; still masked)
    nll, tokens = heldout_nll(logprobs, labels)
    expected = -(math.log(0.5) + math.log(0.25) + math.log(0.8) + math.log(0.1)) / 4
    assert tokens == 4
    assert nll == pytest.approx(expected, abs=1e-12)
    assert nll == pytest.approx(1.1512925, abs=1e-6)  # (0.693147 + 1.386294 + 0.223144 + 2.302585) / 4


def test_nll_refuses_mismatched_rows_a_supervised_first_token_and_an_empty_slice():
    with pytest.raises(ValueError, match="3 log-probabilities for 2 labels"):
        heldout_nll([[None, -1.0, -1.0]], [[-100, 5]])
    with pytest.raises(ValueError, match="first token is supervised"):
        heldout_nll([[None, -1.0]], [[4, 5]])
    with pytest.raises(ValueError, match="no supervised token"):
        heldout_nll([[None, -1.0]], [[-100, -100]])


def test_no_heldout_slice_by_default_and_no_change_to_the_data_identity():
    from common.config import compose
    from common.config.common import computation_config
    from common.paths import heldout_nll_run

    cfg = compose(["experiment=demo", "profile=toy"])
    assert cfg.data.num_heldout_rows == 0
    assert "num_heldout_rows" not in computation_config(cfg.data)
    assert heldout_nll_run(cfg, "base", None) is None
    assert "num_heldout_rows" in computation_config(compose(["experiment=demo", "profile=toy",
                                                             "data.num_heldout_rows=8"]).data)
