"""avg@n and the unbiased pass@k estimator (Chen et al. 2021), per problem and over a benchmark; the mean
sampled-token entropy (:func:`mean_token_entropy`).

For a problem with ``n`` samples of which ``c`` are correct, ``pass@k = 1 − C(n−c, k) / C(n, k)``: the chance that
k samples drawn without replacement from the n contain a correct one. It is computed as the product
``1 − Π_{j=n−c+1}^{n} (1 − k/j)``, which never forms the (huge) binomials. avg@n = mean of c/n is the unbiased
pass@1 (the paper's "pass@1"). Resampling-based best@k (biased low) is deliberately not offered.
"""
from __future__ import annotations

from typing import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: ``1 − C(n−c, k)/C(n, k)`` = ``1 − Π_{j=n−c+1}^{n} (1 − k/j)``; 1 if ``n−c < k``."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n; got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n; got n={n}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for j in range(n - c + 1, n + 1):
        product *= 1.0 - k / j
    return 1.0 - product


def mixed_group_rate(n: int, c: int, g: int) -> float:
    """Unbiased probability that a group of ``g`` samples of one problem (c of n correct) holds both verdicts, the
    groups with a group-relative advantage: ``1 − C(c, g)/C(n, g) − C(n−c, g)/C(n, g)`` = pass@g of the correct plus
    pass@g of the wrong samples − 1 (each ``C(·, g)/C(n, g)`` is the unbiased estimate of p^g or (1 − p)^g)."""
    return max(0.0, pass_at_k(n, c, g) + pass_at_k(n, n - c, g) - 1.0)  # max: rounding can leave -2e-16


def k_values(n: int) -> list[int]:
    """The k of a pass@k curve: 1, 2, 4, … (powers of two up to n), then n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def benchmark_metrics(correct_counts: Sequence[int], n: int, ks: Sequence[int] | None = None) -> dict[str, float]:
    """``avg@n`` (mean of c/n) and ``pass@k`` for every k in ``ks`` (default :func:`k_values`), means over problems."""
    if not correct_counts:
        raise ValueError("benchmark_metrics needs at least one problem")
    problems = len(correct_counts)
    metrics = {f"avg@{n}": sum(c / n for c in correct_counts) / problems}
    for k in ks if ks is not None else k_values(n):
        metrics[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct_counts) / problems
    return metrics


MEAN_TOKEN_ENTROPY = "mean_token_entropy_nats"
"""Metric key: the mean per-token entropy of the sampling distribution over a benchmark's samples, in nats."""


def mean_token_entropy(neg_logprob_sums: Sequence[float | None], num_tokens: Sequence[int]) -> float | None:
    """``Σ_samples (−Σ_t log p(x_t)) / Σ_samples num_tokens``: the mean of ``−log p`` over every sampled token.

    A token ``x ~ p`` has ``E[−log p(x)] = H(p)``, so this is an unbiased Monte-Carlo estimate of the mean entropy (of
    the distribution each token was drawn from) per sampled token. None when any sample lacks its ``neg_logprob_sum``
    (a backend that does not report it, or samples written before it was recorded) or there are no tokens.
    """
    if any(value is None for value in neg_logprob_sums) or sum(num_tokens) == 0:
        return None
    return sum(neg_logprob_sums) / sum(num_tokens)
