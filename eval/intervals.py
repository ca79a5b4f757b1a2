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
"""
from __future__ import annotations

import functools
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
