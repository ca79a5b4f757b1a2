"""Bootstrap intervals against hand-computed resamples: 3 problems, 5 replicates whose indices are written out."""
from __future__ import annotations

import numpy as np
import pytest

from eval.intervals import Draws, Estimate, estimate, paired_difference, per_problem_values, replicates, spearman

# Five replicates of three problems, drawn "by hand".
PROBLEMS = np.array([[0, 0, 1], [2, 2, 2], [0, 1, 2], [1, 1, 0], [0, 2, 2]])
ONE_SEED = np.zeros((5, 1), dtype=int)


def test_problem_bootstrap_by_hand():
    values = np.array([[1.0, 0.0, 0.5]])
    draws = Draws(ONE_SEED, (PROBLEMS,))
    # Replicate means: (1+1+0)/3, (.5+.5+.5)/3, (1+0+.5)/3, (0+0+1)/3, (1+.5+.5)/3.
    assert replicates([values], draws) == pytest.approx([2 / 3, 0.5, 0.5, 1 / 3, 2 / 3])
    # Sorted 1/3, .5, .5, 2/3, 2/3; the 2.5th percentile sits at position 0.025·4 = 0.1: 1/3 + 0.1·(1/2 − 1/3);
    # the 97.5th at 3.9: between 2/3 and 2/3.
    assert estimate([values], draws) == Estimate(pytest.approx(0.5), pytest.approx(0.35), pytest.approx(2 / 3))


def test_seed_then_problem_bootstrap_by_hand():
    values = np.array([[1.0, 0.0, 0.5],   # seed 0
                       [0.0, 0.0, 1.0]])  # seed 1
    seeds = np.array([[0, 0], [0, 1], [1, 1], [1, 0], [0, 0]])
    draws = Draws(seeds, (PROBLEMS,))
    # Per replicate: mean over the drawn problems per seed (seed 0 | seed 1), then over the drawn seeds:
    # [0,0,1]: 2/3 | 0 -> seeds 0,0: 2/3;   [2,2,2]: 1/2 | 1 -> 0,1: 3/4;   [0,1,2]: 1/2 | 1/3 -> 1,1: 1/3;
    # [1,1,0]: 1/3 | 0 -> 1,0: 1/6;         [0,2,2]: 2/3 | 2/3 -> 0,0: 2/3.
    assert replicates([values], draws) == pytest.approx([2 / 3, 3 / 4, 1 / 3, 1 / 6, 2 / 3])
    # Sorted 1/6, 1/3, 2/3, 2/3, 3/4: low 1/6 + 0.1·1/6 = 11/60, high 2/3 + 0.9·(3/4 − 2/3) = 0.741666…
    assert estimate([values], draws) == Estimate(pytest.approx(2.5 / 6), pytest.approx(11 / 60),
                                                 pytest.approx(2 / 3 + 0.075))


def test_paired_difference_uses_the_same_indices_for_both():
    method = np.array([[1.0, 0.0, 0.5]])
    reference = np.array([[0.5, 0.5, 0.0]])
    draws = Draws(ONE_SEED, (PROBLEMS,))
    # method 2/3, 1/2, 1/2, 1/3, 2/3 minus reference 1/2, 0, 1/3, 1/2, 1/6 = 1/6, 1/2, 1/6, -1/6, 1/2;
    # sorted -1/6, 1/6, 1/6, 1/2, 1/2: low -1/6 + 0.1·(1/3) = -2/15, high 1/2.
    delta = paired_difference([method], [reference], draws)
    assert delta == Estimate(pytest.approx(1 / 6), pytest.approx(-2 / 15), pytest.approx(0.5))


def test_several_benchmarks_average_their_replicates():
    first = np.array([[1.0, 0.0, 0.5]])
    second = np.array([[0.0, 1.0]])
    second_draws = np.array([[0, 0], [1, 1], [0, 1], [1, 0], [1, 1]])
    draws = Draws(ONE_SEED, (PROBLEMS, second_draws))
    # second: 0, 1, 1/2, 1/2, 1 per replicate; averaged with the first benchmark's 2/3, 1/2, 1/2, 1/3, 2/3.
    assert replicates([first, second], draws) == pytest.approx([1 / 3, 3 / 4, 1 / 2, 5 / 12, 5 / 6])
    assert estimate([first, second], draws).mean == pytest.approx((0.5 + 0.5) / 2)


def test_generated_draws_are_fixed_and_shaped():
    a, b = Draws.generate(3, [5, 7], replicates=10), Draws.generate(3, [5, 7], replicates=10)
    assert a.seed_index.shape == (10, 3) and [p.shape for p in a.problem_index] == [(10, 5), (10, 7)]
    assert np.array_equal(a.seed_index, b.seed_index) and np.array_equal(a.problem_index[1], b.problem_index[1])
    assert a.seed_index.max() == 2 and a.problem_index[0].max() <= 4


def test_interval_width_matches_the_normal_approximation_on_many_problems():
    values = np.array([[1.0] * 120 + [0.0] * 280])  # 400 problems, mean 0.3
    result = estimate([values])
    half_width = 1.96 * np.sqrt(0.3 * 0.7 / 400)
    assert result.mean == pytest.approx(0.3)
    assert result.high - result.low == pytest.approx(2 * half_width, rel=0.1)


def test_mismatched_shapes_are_rejected():
    with pytest.raises(ValueError, match="seeds, problems"):
        replicates([np.zeros((2, 3))], Draws(ONE_SEED, (PROBLEMS,)))
    with pytest.raises(ValueError, match="equal shapes"):
        paired_difference([np.zeros((1, 3))], [np.zeros((1, 4))])


def test_per_problem_values():
    assert per_problem_values([1, 0, 4], n=4, k=1) == pytest.approx([0.25, 0.0, 1.0])
    assert per_problem_values([1, 0], n=4, k=2) == pytest.approx([0.5, 0.0])  # 1 - C(3,2)/C(4,2)


def test_spearman_by_hand():
    # ranks differ by 0, 1, 1, 0: 1 - 6·2/(4·15) = 0.8
    assert spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    # ties take the average rank: ranks (1.5, 1.5, 3) vs (1, 2, 3) -> r = 1.5 / sqrt(1.5 · 2)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(np.sqrt(0.75))
    assert np.isnan(spearman([1, 2], [2, 1])) and np.isnan(spearman([1, 1, 1], [1, 2, 3]))
