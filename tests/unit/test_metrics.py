"""eval.metrics: unbiased pass@k against hand values and brute-force enumeration of k-subsets."""
from __future__ import annotations

import itertools
from math import comb

import pytest

from eval.metrics import (MEAN_TOKEN_ENTROPY, benchmark_metrics, k_values, mean_token_entropy, mixed_group_rate,
                          pass_at_k)
from eval.run import summarize


def _brute_force(n: int, c: int, k: int) -> float:
    """Fraction of the k-subsets of n samples (c correct) that contain a correct one."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_equals_brute_force_for_every_c_and_k(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_hand_computed_values():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 = c/n
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0 and pass_at_k(4, 1, 4) == 1.0


@pytest.mark.parametrize("n", range(2, 8))
def test_mixed_group_rate_equals_the_share_of_g_subsets_with_both_verdicts(n):
    for c in range(n + 1):
        samples = [1] * c + [0] * (n - c)
        for g in range(1, n + 1):
            subsets = list(itertools.combinations(samples, g))
            mixed = sum(0 < sum(subset) < g for subset in subsets) / len(subsets)
            assert mixed_group_rate(n, c, g) == pytest.approx(mixed, abs=1e-12), (n, c, g)


def test_mixed_group_rate_hand_computed():
    # 2 of 4 correct, groups of 2: 6 pairs, 1 all right, 1 all wrong -> 4/6.
    assert mixed_group_rate(4, 2, 2) == pytest.approx(4 / 6)
    # 1 of 4 correct, groups of 3: C(3,3) = 1 of C(4,3) = 4 groups is all wrong, none all right -> 3/4.
    assert mixed_group_rate(4, 1, 3) == pytest.approx(0.75)
    assert mixed_group_rate(8, 0, 8) == 0.0 and mixed_group_rate(8, 8, 2) == 0.0 and mixed_group_rate(8, 3, 1) == 0.0


def test_large_n_is_stable():
    assert pass_at_k(320, 1, 32) == pytest.approx(0.1)  # C(319,32)/C(320,32) = 288/320
    assert pass_at_k(320, 7, 100) == pytest.approx(1 - comb(313, 100) / comb(320, 100), rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_invalid_arguments_name_themselves(n, c, k):
    with pytest.raises(ValueError, match=f"n={n}"):
        pass_at_k(n, c, k)


def test_k_values():
    assert k_values(1) == [1]
    assert k_values(6) == [1, 2, 4, 6]
    assert k_values(32) == [1, 2, 4, 8, 16, 32]
    assert k_values(320) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 320]


def test_benchmark_metrics_hand_computed():
    metrics = benchmark_metrics([0, 1, 4], n=4)
    assert metrics["avg@4"] == pytest.approx((0 + 0.25 + 1) / 3)
    assert metrics["pass@1"] == pytest.approx(metrics["avg@4"])
    assert metrics["pass@2"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert metrics["pass@4"] == pytest.approx(2 / 3)
    assert set(metrics) == {"avg@4", "pass@1", "pass@2", "pass@4"}


def test_mean_token_entropy_pools_tokens_over_samples():
    # Three samples: 2 tokens with -log p = 0.5 + 1.5, 1 token with 0.7, 3 tokens summing to 3.2 -> (2 + 0.7 + 3.2) / 6.
    assert mean_token_entropy([2.0, 0.7, 3.2], [2, 1, 3]) == pytest.approx(5.9 / 6)
    # Pooled over tokens, not a mean of per-sample means ((1 + 0.7 + 3.2/3) / 3 would be 0.922...).
    assert mean_token_entropy([2.0, 0.7, 3.2], [2, 1, 3]) != pytest.approx((1 + 0.7 + 3.2 / 3) / 3)


def test_mean_token_entropy_is_none_without_every_samples_logprobs():
    assert mean_token_entropy([2.0, None], [2, 1]) is None  # a sample written before the field existed
    assert mean_token_entropy([0.0], [0]) is None


def test_summary_reads_samples_with_and_without_neg_logprob_sum():
    def record(pid, index, tokens, **extra):
        return {"problem_id": pid, "sample_index": index, "num_tokens": tokens, "finish_reason": "stop",
                "answer": "1", "correct": 1, **extra}

    new = [[record("a", 0, 4, neg_logprob_sum=2.0), record("a", 1, 2, neg_logprob_sum=1.0)],
           [record("b", 0, 2, neg_logprob_sum=0.6), record("b", 1, 2, neg_logprob_sum=0.4)]]
    assert summarize(new, 2)[MEAN_TOKEN_ENTROPY] == pytest.approx(4.0 / 10)
    old = [[record("a", 0, 4), record("a", 1, 2)]]  # samples.jsonl from before: no neg_logprob_sum
    assert summarize(old, 2)[MEAN_TOKEN_ENTROPY] is None


def test_summary_counts_the_samples_the_time_limit_scored():
    def record(pid, index, **extra):
        return {"problem_id": pid, "sample_index": index, "num_tokens": 2, "finish_reason": "stop", "answer": "1",
                "correct": 0, **extra}

    records = [[record("a", 0, time_limited=True), record("a", 1, time_limited=False)],
               [record("b", 0), record("b", 1)]]
    assert summarize(records, 2)["time_limited_samples"] == 1  # samples written before the field count as judged
