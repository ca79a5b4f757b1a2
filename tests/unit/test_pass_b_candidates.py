"""``bench.pass_b_candidates``: the objective written once per term (:func:`chunk_objective`), differentiated by
autograd, equals the trainer's hand-derived pass B (``_HeadPlan.chunk_value_and_grad``) in value and logit gradient,
term by term, in fp32. The compiled candidates (each compiles for 20-40 s on 2 cores):
tests/e2e/test_pass_b_candidates_compiled.py."""
from __future__ import annotations

import pytest
import torch

from bench.pass_b_candidates import hand_derived, objective_value_and_grad, written_once
from sft.token_stats import OBJECTIVE_TERMS, REFERENCE_TERMS

ROWS, VOCAB = 7, 23
TOLERANCE = 2e-6
"""Relative to the largest entry: each fp32 evaluation is within ~1e-6 of fp64 (the KL's summation order differs)."""


def chunk(seed: int = 0) -> dict:
    """fp32 policy and reference logits of one chunk, targets, and old-policy ``log p_y`` with one row outside PSFT's
    clamp on each side (its ratio gradient is 0 there)."""
    generator = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(ROWS, VOCAB, generator=generator)
    targets = torch.randint(0, VOCAB, (ROWS,), generator=generator)
    logp_y = torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1)
    old_logp = logp_y + 0.5 * torch.randn(ROWS, generator=generator)
    old_logp[0], old_logp[1] = logp_y[0] - 25.0, logp_y[1] + 25.0
    return {"logits": logits, "ref_logits": logits + torch.randn(ROWS, VOCAB, generator=generator),
            "targets": targets, "old_logp": old_logp}


def coefficients(names, seed: int = 1) -> dict[str, torch.Tensor]:
    """A coefficient per row and term; reference terms on some rows only (the trainer builds reference logits for
    the rows with a non-zero one)."""
    generator = torch.Generator().manual_seed(seed)
    coefs = {name: torch.randn(ROWS, generator=generator) for name in names}
    for name in REFERENCE_TERMS & set(coefs):
        coefs[name][torch.rand(ROWS, generator=generator) < 0.5] = 0.0
    return coefs


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def assert_equal_to_the_trainer(coefs: dict[str, torch.Tensor], gem_beta: float = 1.0,
                                gem_weighting: str = "linear") -> None:
    inputs = chunk()
    frozen = {"ref_logits": inputs["ref_logits"], "old_logp": inputs["old_logp"], "gem_beta": gem_beta,
              "gem_weighting": gem_weighting}
    value, grad = hand_derived(inputs["logits"].clone(), coefs, inputs["targets"], **frozen)
    once_value, once_grad = written_once(inputs["logits"], inputs["targets"], coefs,
                                         differentiate=objective_value_and_grad, **frozen)
    assert relative_error(once_value, value) < TOLERANCE
    assert relative_error(once_grad, grad) < TOLERANCE


@pytest.mark.parametrize("name", sorted(OBJECTIVE_TERMS))
def test_each_term_written_once_has_the_trainers_value_and_hand_derived_gradient(name):
    assert_equal_to_the_trainer(coefficients([name]))


@pytest.mark.parametrize("gem_weighting", ["linear", "logsigmoid"])
def test_all_terms_at_once_match_the_trainer_for_both_gem_weightings(gem_weighting):
    assert_equal_to_the_trainer(coefficients(sorted(OBJECTIVE_TERMS)), gem_beta=0.7, gem_weighting=gem_weighting)


