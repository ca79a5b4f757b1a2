"""95% intervals for table cells and pass@k curves: a bootstrap over problems, and over seeds when there are several.

A cell's data is one matrix per benchmark, ``values[s, p]`` = the per-problem metric of seed ``s`` on problem ``p``
(c/n for pass@1 = avg@n; the unbiased ``1 − C(n−c, k)/C(n, k)`` for pass@k, :func:`per_problem_values`). Its
estimate is the mean over benchmarks of each benchmark's mean over seeds and problems (a single benchmark: that
mean; the ``Avg`` column: the mean of the benchmark columns).

Resampling (:class:`Draws`), ``B`` = :data:`REPLICATES` replicates from ``numpy.random.default_rng(BOOTSTRAP_SEED)``:

1. seeds: ``seed_index = rng.integers(0, S, size=(B, S))`` — each replicate draws S of the S seeds with replacement
   (a seed is a whole training + evaluation run, so one draw serves every benchmark of the replicate);
2. problems, per benchmark ``g`` in column order: ``problem_index[g] = rng.integers(0, P_g, size=(B, P_g))``.
   Seeds evaluate the same problems, so the drawn problems are used for every drawn seed (a crossed design).

Replicate ``b`` = mean over benchmarks ``g`` of ``mean_{i, j} values_g[seed_index[b, i], problem_index[g][b, j]]``.
The interval is the 2.5th and 97.5th percentile of the ``B`` replicates (``numpy.percentile``, linear
interpolation). With one seed step 1 is a no-op and this is the plain bootstrap over problems.

Paired difference of a row to a reference row (:func:`paired_difference`): both on the seeds and problems they
share, each replicate evaluates both rows on the *same* drawn indices and takes the difference, so the shared
difficulty of the problems (and a seed's shared data order) cancels.

The draws depend only on the shape (S, P_1, …) and the fixed seed, so a report is reproducible bit for bit.

Seed level (:func:`seed_t_interval`, :func:`seed_t_test`). With S seeds the draws above hold at most
C(2S − 1, S) distinct seed resamples (10 for S = 3), and the bootstrap variance of a mean of S per-seed values is
(S − 1)/S of the usual estimate s²/S (2/3 for S = 3), so the interval above understates the seed-to-seed spread.
The seed-level interval is Student's t over the S per-seed means (each the mean over benchmarks of the seed's mean
over problems; for a paired difference, the per-seed differences): ``mean ± t_{0.975, S−1} · sd / √S`` with the
sample sd (ddof = 1). It is exact when the per-seed means are normal (each averages problems × samples) and is
conditional on the problem set: it says how far another seed's training run may land on these problems. Where
several SFT seeds are nested in each of several base models, the per-seed values are first averaged within each base
model (:func:`top_level_means`) and the t runs over the base models: the base model is the top-level random factor.
:func:`seed_t_test` is the matching two-sided t-test of mean 0 (the Δ tables' p-values; per-seed values with no
spread have none, :data:`NO_SPREAD`); :func:`holm` adjusts a family of them (only the p-values: the intervals
are the unadjusted 95% ones). :func:`cluster_spearman` resamples whole clusters (arms) for a rank correlation over pseudo-replicated
points (several seeds per arm).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from eval.metrics import pass_at_k

REPLICATES = 2000
BOOTSTRAP_SEED = 20240531
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """A mean and its interval, in the units of the values (the tables use percent)."""

    mean: float
    low: float
    high: float

    def scaled(self, factor: float) -> "Estimate":
        return Estimate(self.mean * factor, self.low * factor, self.high * factor)

    def separated_from(self, other: "Estimate") -> bool:
        """True when the two intervals do not overlap."""
        return self.low > other.high or other.low > self.high


@dataclass(frozen=True)
class Draws:
    """Resampling indices: ``seed_index`` [B, S] and, per benchmark, ``problem_index[g]`` [B, P_g]."""

    seed_index: np.ndarray
    problem_index: tuple[np.ndarray, ...]
    problem_weights: tuple[np.ndarray, ...] = field(init=False, repr=False, compare=False)
    """Per benchmark [B, P_g]: how often replicate b drew problem p, over P_g (so ``weights @ values.T`` is the mean
    over the drawn problems)."""

    def __post_init__(self):
        weights = []
        for index in self.problem_index:
            replicates, problems = index.shape
            flat = (np.arange(replicates)[:, None] * problems + index).ravel()
            weights.append(np.bincount(flat, minlength=replicates * problems).reshape(replicates, problems) / problems)
        object.__setattr__(self, "problem_weights", tuple(weights))

    @classmethod
    def generate(cls, num_seeds: int, problems: Sequence[int], replicates: int = REPLICATES,
                 seed: int = BOOTSTRAP_SEED) -> "Draws":
        """The module docstring's draws: seeds first, then each benchmark's problems, from one fixed-seed stream."""
        return _generate(num_seeds, tuple(problems), replicates, seed)


@functools.lru_cache(maxsize=256)
def _generate(num_seeds: int, problems: tuple[int, ...], replicates: int, seed: int) -> Draws:
    if num_seeds < 1 or any(p < 1 for p in problems):
        raise ValueError(f"need at least one seed and one problem per benchmark; got {num_seeds}, {list(problems)}")
    rng = np.random.default_rng(seed)
    seed_index = rng.integers(0, num_seeds, size=(replicates, num_seeds))
    return Draws(seed_index, tuple(rng.integers(0, p, size=(replicates, p)) for p in problems))


def per_problem_values(counts: Sequence[int], n: int, k: int) -> np.ndarray:
    """Per-problem pass@k estimates in [0, 1]: c/n for k = 1, else ``1 − C(n−c, k)/C(n, k)`` (:func:`pass_at_k`)."""
    if k == 1:
        return np.asarray(counts, dtype=float) / n
    return np.array([pass_at_k(n, c, k) for c in counts], dtype=float)


def common_problems(by_seed: dict[int, dict], seeds: Sequence[int]) -> list[str]:
    """Problem ids every one of ``seeds`` evaluated (``by_seed``: seed → ``metrics.json``), sorted."""
    return sorted(set.intersection(*(set(by_seed[s]["correct_counts"]) for s in seeds)))


def value_matrix(by_seed: dict[int, dict], seeds: Sequence[int], problems: Sequence[str], k: int) -> np.ndarray:
    """[seeds, problems] per-problem estimates (:func:`per_problem_values`) from each seed's ``metrics.json``."""
    return np.stack([per_problem_values([by_seed[s]["correct_counts"][p] for p in problems], by_seed[s]["n"], k)
                     for s in seeds])


def _check(groups: Sequence[np.ndarray], draws: Draws) -> None:
    if len(groups) != len(draws.problem_index):
        raise ValueError(f"{len(groups)} benchmarks but draws for {len(draws.problem_index)}")
    for g, (values, index) in enumerate(zip(groups, draws.problem_index)):
        if values.shape != (draws.seed_index.shape[1], index.shape[1]):
            raise ValueError(f"benchmark {g}: values of shape {values.shape}, draws for "
                             f"{(draws.seed_index.shape[1], index.shape[1])} (seeds, problems)")


def replicates(groups: Sequence[np.ndarray], draws: Draws) -> np.ndarray:
    """[B] bootstrap replicates of ``mean_g mean_{s, p} groups[g][s, p]`` under ``draws``."""
    _check(groups, draws)
    total = np.zeros(draws.seed_index.shape[0])
    for values, weights in zip(groups, draws.problem_weights):
        by_seed = weights @ values.T  # [B, S]: mean over the drawn problems, for every seed
        total += np.take_along_axis(by_seed, draws.seed_index, axis=1).mean(axis=1)  # then over the drawn seeds
    return total / len(groups)


def percentile_interval(samples: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def estimate(groups: Sequence[np.ndarray], draws: Draws | None = None) -> Estimate:
    """Mean over benchmarks of the mean over seeds and problems, with its bootstrap interval."""
    groups = [np.asarray(g, dtype=float) for g in groups]
    draws = draws or Draws.generate(groups[0].shape[0], [g.shape[1] for g in groups])
    low, high = percentile_interval(replicates(groups, draws))
    return Estimate(float(np.mean([g.mean() for g in groups])), low, high)


def paired_difference(groups: Sequence[np.ndarray], reference: Sequence[np.ndarray],
                      draws: Draws | None = None) -> Estimate:
    """``estimate(groups) − estimate(reference)`` with the interval of the paired replicates (same indices for
    both); the two must hold the same seeds and problems in the same order."""
    groups = [np.asarray(g, dtype=float) for g in groups]
    reference = [np.asarray(g, dtype=float) for g in reference]
    if [g.shape for g in groups] != [g.shape for g in reference]:
        raise ValueError(f"paired difference needs equal shapes; got {[g.shape for g in groups]} and "
                         f"{[g.shape for g in reference]}")
    draws = draws or Draws.generate(groups[0].shape[0], [g.shape[1] for g in groups])
    low, high = percentile_interval(replicates(groups, draws) - replicates(reference, draws))
    mean = np.mean([g.mean() for g in groups]) - np.mean([g.mean() for g in reference])
    return Estimate(float(mean), low, high)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the ranks (ties get their average rank); nan if a side is
    constant or there are fewer than 3 pairs."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"spearman needs equal lengths; got {len(x)} and {len(y)}")
    if len(x) < 3:
        return float("nan")
    rx, ry = _average_ranks(x), _average_ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


# --------------------------------------------------------------------------------------- seed level
def per_seed_means(groups: Sequence[np.ndarray]) -> np.ndarray:
    """[S]: each seed's mean over benchmarks of its mean over problems (``groups[g][s, p]`` as in :func:`estimate`)."""
    return np.mean([np.asarray(g, dtype=float).mean(axis=1) for g in groups], axis=0)


def top_level_means(per_seed: Sequence[float], units: Sequence) -> np.ndarray:
    """[U]: the mean of the per-seed values within each top-level unit (``units[i]``: seed i's unit; in order of
    first appearance). With several SFT seeds nested in each base model (``experiment.base_seeds``) the unit is the
    base seed, so the t-interval and t-test run over base models (df = U − 1), not over the nested runs; with one
    run per unit it is the identity."""
    values = np.asarray(per_seed, dtype=float)
    order = list(dict.fromkeys(units))
    return np.array([values[[u == unit for u in units]].mean() for unit in order])


def student_t_tail(t: float, df: int) -> float:
    """Two-sided tail ``P(|T_df| ≥ |t|) = I_{df/(df + t²)}(df/2, 1/2)``, Student's t with ``df`` degrees of freedom
    (the regularised incomplete beta function, ``mpmath.betainc``)."""
    import mpmath

    if df < 1:
        raise ValueError(f"Student's t needs df >= 1; got {df}")
    if math.isinf(t):
        return 0.0
    return float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))


@functools.lru_cache(maxsize=64)
def student_t_quantile(probability: float, df: int) -> float:
    """The q with ``P(T_df ≤ q) = probability`` for ``probability`` in [0.5, 1): the root of
    ``student_t_tail(q, df) = 2 (1 − probability)`` by bisection (the tail falls monotonically in q)."""
    if not 0.5 <= probability < 1:
        raise ValueError(f"student_t_quantile needs 0.5 <= probability < 1; got {probability}")
    tail = 2 * (1 - probability)
    low, high = 0.0, 1.0
    while student_t_tail(high, df) > tail:
        low, high = high, 2 * high
    for _ in range(200):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        low, high = (middle, high) if student_t_tail(middle, df) > tail else (low, middle)
    return (low + high) / 2


def seed_t_interval(per_seed: Sequence[float], confidence: float = CONFIDENCE) -> Estimate | None:
    """Mean of the per-seed values with Student's t interval ``mean ± t_{(1+confidence)/2, S−1} · sd / √S`` (sample
    sd, ddof = 1); None with fewer than 2 seeds."""
    values = np.asarray(per_seed, dtype=float)
    if len(values) < 2:
        return None
    mean = float(values.mean())
    half = student_t_quantile((1 + confidence) / 2, len(values) - 1) * float(values.std(ddof=1)) / math.sqrt(len(values))
    return Estimate(mean, mean - half, mean + half)


NO_SPREAD = math.nan
"""What :func:`seed_t_test` returns when every seed gives the same value: the t statistic is undefined (sd = 0), so
there is no p, neither 0 nor 1 (:func:`no_spread` tests for it; the tables print "no spread")."""


ROUNDING = 1e-9
"""The relative spread :func:`seed_t_test` reads as rounding, far below the step of any mean of pass@k values."""


def no_spread(p_value: float | None) -> bool:
    """Whether ``p_value`` is :data:`NO_SPREAD` (per-seed values without spread: the t-test is undefined)."""
    return p_value is not None and math.isnan(p_value)


def seed_t_test(per_seed: Sequence[float]) -> float | None:
    """Two-sided p of the one-sample t-test of mean 0 over the per-seed values (for a paired difference: the
    per-seed differences), ``t = mean / (sd / √S)`` with S − 1 degrees of freedom; None with fewer than 2 seeds, and
    :data:`NO_SPREAD` when the values are all equal (sd = 0: t is x/0 or 0/0, and the test says nothing). Equal
    means equal up to rounding, sd ≤ :data:`ROUNDING` · max(1, |mean|): per-seed means computed from counts can
    differ in the last bits where the counts agree."""
    values = np.asarray(per_seed, dtype=float)
    if len(values) < 2:
        return None
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    if sd <= ROUNDING * max(1.0, abs(mean)):
        return NO_SPREAD
    return student_t_tail(mean / (sd / math.sqrt(len(values))), len(values) - 1)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: with the m p-values sorted ascending,
    ``p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j))``. Rejecting where ``p̃ ≤ α`` controls the family-wise error
    rate at α for any dependence between the tests."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


# ---------------------------------------------------------------------------- clustered correlation
@dataclass(frozen=True)
class ClusteredCorrelation:
    """A rank correlation over points that come in clusters, with the interval of the cluster bootstrap."""

    estimate: Estimate
    """Spearman's ρ over every point; the interval's ends are nan when no replicate had a defined ρ."""
    clusters: int
    undefined: int
    """Replicates left out because a side was constant in them (ρ undefined)."""


def cluster_spearman(x: Sequence[float], y: Sequence[float], clusters: Sequence, replicates: int = REPLICATES,
                     seed: int = BOOTSTRAP_SEED, confidence: float = CONFIDENCE) -> ClusteredCorrelation:
    """:func:`spearman` of ``x`` and ``y`` with a percentile interval that resamples clusters, not points.

    ``clusters[i]`` names point i's cluster (an arm, whose seeds are its points). Replicate b draws K of the K clusters
    with replacement (``numpy.random.default_rng(seed).integers(0, K, size=(B, K))``, clusters in order of first
    appearance) and takes Spearman's ρ over every point of every drawn cluster, a cluster drawn twice counting twice:
    :func:`spearman` of the expanded sample, computed from each point's multiplicity (:func:`weighted_spearman`).
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    names = list(dict.fromkeys(clusters))
    rho = spearman(x, y)
    if math.isnan(rho):  # fewer than 3 points or a constant side: nothing to resample
        return ClusteredCorrelation(Estimate(rho, math.nan, math.nan), len(names), 0)
    member = np.array([names.index(c) for c in clusters])
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, len(names), size=(replicates, len(names)))
    counts = (drawn[:, :, None] == np.arange(len(names))).sum(axis=1)  # [B, K]: how often each cluster was drawn
    rhos = weighted_spearman(x, y, counts[:, member].astype(float))
    valid = rhos[~np.isnan(rhos)]
    low, high = percentile_interval(valid, confidence) if len(valid) else (math.nan, math.nan)
    return ClusteredCorrelation(Estimate(rho, low, high), len(names), int(np.isnan(rhos).sum()))


def weighted_spearman(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[B] Spearman's ρ of the samples in which point i occurs ``weights[b, i]`` times (0 = left out): average ranks
    ``Σ_j w_j [v_j < v_i] + (Σ_j w_j [v_j = v_i] + 1)/2``, then Pearson's r of the ranks with weights w; nan where a
    side is constant."""
    def ranks(values: np.ndarray) -> np.ndarray:
        below = (values[None, :] < values[:, None]).astype(float)  # [i, j]: v_j < v_i
        tied = (values[None, :] == values[:, None]).astype(float)
        return np.einsum("bj,ij->bi", weights, below) + (np.einsum("bj,ij->bi", weights, tied) + 1) / 2

    total = weights.sum(axis=1, keepdims=True)
    rx, ry = ranks(x), ranks(y)
    rx = rx - (weights * rx).sum(axis=1, keepdims=True) / total
    ry = ry - (weights * ry).sum(axis=1, keepdims=True) / total
    covariance, var_x, var_y = ((weights * a * b).sum(axis=1) for a, b in ((rx, ry), (rx, rx), (ry, ry)))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = covariance / np.sqrt(var_x * var_y)
    constant = (var_x <= 1e-12 * total[:, 0] ** 3) | (var_y <= 1e-12 * total[:, 0] ** 3)
    return np.where(constant, np.nan, rho)
