"""Bootstrap intervals against hand-computed resamples: 3 problems, 5 replicates whose indices are written out."""
from __future__ import annotations

import numpy as np
import pytest

from eval.intervals import (
    NO_SPREAD,
    Draws,
    Estimate,
    cluster_spearman,
    estimate,
    holm,
    no_spread,
    paired_difference,
    per_problem_values,
    per_seed_means,
    replicates,
    seed_t_interval,
    seed_t_test,
    spearman,
    student_t_quantile,
    student_t_tail,
    weighted_spearman,
)
from report.tables import holm_family, p_value_record, p_value_text

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


# ------------------------------------------------------------------------------ few seeds (issue 27)
def test_student_t_against_the_printed_table():
    # t_{0.975, df} from any statistics table; and the df = 2 tail in closed form, 1 − t / sqrt(2 + t²).
    for df, quantile in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (30, 2.0423)):
        assert student_t_quantile(0.975, df) == pytest.approx(quantile, abs=1e-4)
    assert student_t_tail(3.0, 2) == pytest.approx(1 - 3 / np.sqrt(11))
    assert student_t_tail(0.0, 5) == pytest.approx(1.0) and student_t_tail(float("inf"), 2) == 0.0


def test_seed_t_interval_and_test_by_hand():
    # Per-seed values 1, 2, 3: mean 2, sd 1; half-width t_{0.975, 2} / sqrt(3) = 4.302653 / 1.732051 = 2.484138.
    assert seed_t_interval([1.0, 2.0, 3.0]) == Estimate(2.0, pytest.approx(-0.484138, abs=1e-6),
                                                        pytest.approx(4.484138, abs=1e-6))
    # t = 2 / (1 / sqrt(3)) = sqrt(12); df = 2: p = 1 − t / sqrt(2 + t²) = 1 − sqrt(12 / 14).
    assert seed_t_test([1.0, 2.0, 3.0]) == pytest.approx(1 - np.sqrt(12 / 14))
    assert seed_t_interval([5.0]) is None and seed_t_test([5.0]) is None  # one seed: no seed-level statement
    assert seed_t_interval([2.0, 2.0]) == Estimate(2.0, 2.0, 2.0)
    # per-seed means: benchmark means per seed, then their mean over benchmarks
    assert per_seed_means([np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([[0.0], [0.5]])]) == pytest.approx([0.25, 0.75])


def test_seed_t_test_reports_no_spread_instead_of_a_p_value():
    # ProFit's Avg pass@32 was 50.0 on every seed (docs/results/2026-11-26-forking-ablations.md): the per-seed
    # differences to SFT have sd 0, t = x / 0 is undefined, and the test says nothing; it used to return p = 0.
    for equal in ([-15.6, -15.6, -15.6], [2.0, 2.0], [0.0, 0.0, 0.0]):
        assert no_spread(seed_t_test(equal))
    assert not no_spread(seed_t_test([1.0, 2.0, 3.0])) and not no_spread(None)
    # Equal up to rounding: the toy report's SFT pass@8 after RL minus Base + DAPO's, per seed, is −20 on both seeds
    # as computed from counts (sd 5e-14); an exact sd == 0 test gave p = 1.8e-16.
    assert no_spread(seed_t_test([-20.000000000000007, -19.99999999999993]))
    assert not no_spread(seed_t_test([-20.0, -20.0 + 1e-3]))  # a real spread, far below a pass@k mean's step
    # a no-spread comparison stays in its Holm family as p = 1 (the family keeps its size) and keeps its mark
    adjusted = holm_family({"a": 0.01, "b": NO_SPREAD, "c": 0.04, "d": None})
    assert adjusted["a"] == pytest.approx(0.03) and adjusted["c"] == pytest.approx(0.08)
    assert no_spread(adjusted["b"]) and adjusted["d"] is None
    assert p_value_text(adjusted["b"]) == "n/a (no spread)" and p_value_record(adjusted["b"]) == "no spread"


def test_holm_by_hand():
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.4]) == pytest.approx([0.8, 0.8])  # 0.4·2 = 0.8, then max(0.8, 0.5·1)
    assert holm([0.3, 0.9, 0.6]) == pytest.approx([0.9, 1.0, 1.0])  # capped at 1
    assert holm([0.01]) == [0.01] and holm([]) == []


def test_crossed_bootstrap_over_three_seeds_has_ten_resamples_and_two_thirds_of_the_seed_variance():
    draws = Draws.generate(3, [1])
    distinct = {tuple(sorted(row)) for row in draws.seed_index.tolist()}
    assert len(distinct) == 10  # the multisets of 3 of 3 seeds: C(5, 3)
    # One problem, so only the seeds vary: per-seed values 0, 1, 2 (s² = 1). The usual variance of their mean is
    # s²/S = 1/3; the bootstrap's is (S − 1)/S of that, 2/9.
    bootstrap_variance = replicates([np.array([[0.0], [1.0], [2.0]])], draws).var()
    assert bootstrap_variance / (1 / 3) == pytest.approx(2 / 3, abs=0.03)


SEEDS, PROBLEMS_PER_SEED, TRUE_MEAN, SEED_SD, NOISE_SD = 3, 50, 0.5, 0.05, 0.1
"""The synthetic case of docs/evaluation.md ("Intervals with few seeds"): value[s, p] = μ + a_s + e_sp with a seed
effect a_s ~ N(0, 0.05²) shared by a seed's problems and independent noise e_sp ~ N(0, 0.1²), 3 seeds, 50 problems."""


def crossed_bootstrap_intervals(values: np.ndarray) -> np.ndarray:
    """[E, 2] :func:`estimate`'s intervals of E one-benchmark experiments [E, S, P] at once (its draws depend only on
    the shape, so every experiment uses the same ones)."""
    draws = Draws.generate(values.shape[1], [values.shape[2]])
    experiments, seeds, problems = values.shape
    by_seed = (values.reshape(-1, problems) @ draws.problem_weights[0].T).reshape(experiments, seeds, -1)  # [E, S, B]
    reps = np.take_along_axis(by_seed, draws.seed_index.T[None], axis=1).mean(axis=1)  # [E, B]
    return np.percentile(reps, [2.5, 97.5], axis=1).T


def test_coverage_on_a_synthetic_case_with_known_seed_variance():
    rng = np.random.default_rng(27)
    experiments = 2000
    values = (TRUE_MEAN + rng.normal(0, SEED_SD, size=(experiments, SEEDS, 1))
              + rng.normal(0, NOISE_SD, size=(experiments, SEEDS, PROBLEMS_PER_SEED)))
    bootstrap = crossed_bootstrap_intervals(values)
    for e in range(3):  # the batched intervals are the report's
        cell = estimate([values[e]])
        assert bootstrap[e] == pytest.approx([cell.low, cell.high])
    seed_level = [seed_t_interval(per_seed_means([v])) for v in values]
    t_coverage = np.mean([i.low <= TRUE_MEAN <= i.high for i in seed_level])
    bootstrap_coverage = np.mean((bootstrap[:, 0] <= TRUE_MEAN) & (TRUE_MEAN <= bootstrap[:, 1]))
    # 2000 experiments: a true 95% lands within ±1.5 points (three binomial standard errors) of 95%.
    assert 0.935 <= t_coverage <= 0.965, t_coverage
    assert bootstrap_coverage < 0.88, bootstrap_coverage  # measured 0.830 (docs/evaluation.md)
    assert np.mean([i.high - i.low for i in seed_level]) > np.mean(bootstrap[:, 1] - bootstrap[:, 0])


def test_cluster_resamples_are_spearman_of_the_expanded_sample():
    x = np.array([0.1, 0.4, 0.2, 0.9, 0.8, 0.3, 0.5, 0.5])
    y = np.array([1.0, 0.0, 2.0, 3.0, 5.0, 4.0, 4.0, 6.0])
    arms = ["a", "a", "b", "b", "b", "c", "d", "d"]
    member = np.array([0, 0, 1, 1, 1, 2, 3, 3])
    drawn = np.array([[0, 0, 1, 3], [2, 2, 2, 1], [3, 1, 0, 2], [1, 1, 3, 3]])  # clusters a..d, drawn by hand
    weights = np.stack([np.bincount(row, minlength=4)[member] for row in drawn]).astype(float)
    expanded = [np.concatenate([np.flatnonzero(member == c) for c in row]) for row in drawn]
    assert weighted_spearman(x, y, weights) == pytest.approx([spearman(x[i], y[i]) for i in expanded])
    # Same for the draws cluster_spearman makes itself: its interval is the percentiles of these.
    generated = np.random.default_rng(7).integers(0, 4, size=(50, 4))
    rhos = [spearman(x[i], y[i]) for i in
            (np.concatenate([np.flatnonzero(member == c) for c in row]) for row in generated)]
    result = cluster_spearman(x, y, arms, replicates=50, seed=7)
    valid = [r for r in rhos if not np.isnan(r)]
    assert result.estimate == Estimate(pytest.approx(spearman(x, y)), pytest.approx(np.percentile(valid, 2.5)),
                                       pytest.approx(np.percentile(valid, 97.5)))
    assert result.clusters == 4 and result.undefined == len(rhos) - len(valid)


def test_resampling_arms_not_pairs_on_pseudo_replicated_pairs():
    # 6 arms x 3 seeds; the pre-RL diagnostic and the RL gain are independent at the arm level (true ρ = 0), and the
    # seeds of an arm lie close together. The 18 pairs look like 18 points but hold 6 arms' worth of information.
    rng = np.random.default_rng(0)
    arms = np.repeat(np.arange(6), 3)
    excludes_zero = {"arms": 0, "pairs": 0}
    experiments = 200
    for _ in range(experiments):
        x = rng.normal(size=6)[arms] + rng.normal(0, 0.3, size=18)
        y = rng.normal(size=6)[arms] + rng.normal(0, 0.3, size=18)
        for name, clusters in (("arms", arms), ("pairs", np.arange(18))):
            interval = cluster_spearman(x, y, clusters, replicates=1000).estimate
            excludes_zero[name] += not interval.low <= 0 <= interval.high
    # Resampling pairs calls a correlation that is not there about a quarter of the time; resampling arms about as
    # often as a 95% interval should (measured 0.25 and 0.06).
    assert excludes_zero["pairs"] / experiments > 0.18
    assert excludes_zero["arms"] / experiments < 0.1
