"""The forking toy world through the base and data stages at a tiny budget (``experiment=forking``).

Twenty pretraining steps give a model that is still guessing, so this checks that the entropy profile is measured
and recorded in the base manifest, not the bound (docs/results/2026-11-23-forking-base-entropy-profile.md has the
full-budget figure). The greedy health check after pretraining (200 tokens a problem) is off: nothing here reads it.
"""
from __future__ import annotations

import json
import math

import pytest

from common.config import compose
from common.config.toy import FORK_FAMILIES, FORK_STRATEGIES
from common.paths import base_model_path, data_run

pytestmark = pytest.mark.integration

TINY = ["toy.pretrain_steps=20", "toy.pretrain_batch_size=4", "toy.pretrain_seq_len=128", "toy.num_pretrain_docs=500",
        "toy.pretrain_eval_problems=0", "toy.fork_entropy_problems=3", "toy.fork_entropy_samples=2",
        "toy.num_rows=150", "toy.num_benchmark_problems=10", "data.num_sft_rows=60", "data.num_rl_val_rows=8",
        "logging.progress=false"]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return compose(["experiment=forking", "profile=toy", f"experiment.run_root={root}", *TINY])


def test_base_manifest_records_the_entropy_profile(cfg):
    from toy import base as base_stage

    metrics = base_stage.run(cfg).metrics
    assert metrics["steps"] == 20
    for name in ("fork", "digits", "other"):
        assert math.isfinite(metrics[f"entropy_{name}_nats"]) and metrics[f"entropy_{name}_nats"] >= 0
        assert metrics[f"entropy_{name}_tokens"] > 0
    assert metrics["entropy_fork_tokens"] == 3 * 2  # one fork token per sample
    for family in FORK_FAMILIES:
        shares = [metrics[f"samples_{family}_{strategy}_share"] for strategy in FORK_STRATEGIES]
        assert all(0 <= share <= 1 for share in shares) and sum(shares) <= 1 + 1e-9
        assert 0 <= metrics[f"samples_{family}_accuracy"] <= 1


def test_exact_fork_distribution_agrees_with_the_sampled_fork_entropy(cfg):
    """The fork is the first response token, so the entropy of the next-token distribution after each prompt (one
    forward pass, no sampling) is what the sampled profile averages at the fork, on the same problems."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toy import base as base_stage
    from toy.entropy import fork_distribution

    metrics = base_stage.run(cfg).metrics  # already complete: the manifest's figures
    folder = base_model_path(cfg)
    exact = fork_distribution(AutoModelForCausalLM.from_pretrained(folder).eval(),
                              AutoTokenizer.from_pretrained(folder), cfg.toy)
    assert exact["fork_entropy_nats"] == pytest.approx(metrics["entropy_fork_nats"], abs=1e-4)
    for family in FORK_FAMILIES:
        probabilities = [exact[f"fork_{family}_p_{strategy}"] for strategy in FORK_STRATEGIES]
        assert all(0 < p < 1 for p in probabilities) and sum(probabilities) <= 1 + 1e-6
        assert 0 <= exact[f"fork_{family}_entropy_nats"] <= math.log(cfg.toy.vocab_size)


def test_data_stage_writes_teacher_rows_and_family_benchmarks(cfg):
    from data import prepare

    prepare.run(cfg)
    out = data_run(cfg).directory
    rows = [json.loads(line) for line in open(out / prepare.TOY_ROWS)]
    assert len(rows) == 150
    assert sum(row["target"][0]["content"].startswith("Place value:") for row in rows) / len(rows) >= 0.7
    for family in FORK_FAMILIES:
        records = [json.loads(line) for line in open(out / "benchmarks" / f"toy_fork_{family}.jsonl")]
        assert len(records) == 10 and all(" + " in r["problem"] for r in records)
