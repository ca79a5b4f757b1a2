"""``bench.pass_b_candidates``' compiled candidates on a tiny EKSFT chunk, where compiling takes too long for the
default suite (``make test-e2e``; 20-40 s each on 2 cores): the objective written once, compiled three ways, equals
the trainer's eager hand-derived pass B in value and logit gradient; the trainer's pass B compiled equals it eager.
Every objective term, eager: tests/unit/test_pass_b_candidates.py."""
from __future__ import annotations

import pytest
import torch

from bench.pass_b_candidates import candidates, eksft_chunk

TOLERANCE = 2e-6
"""Relative to the largest entry, as tests/unit/test_pass_b_candidates.py."""


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max()).item()


@pytest.fixture(autouse=True)
def fresh_dynamo_cache():
    torch._dynamo.reset()
    yield


@pytest.mark.parametrize(("candidate", "trainer"), [("once, compiled", "today, summed"),
                                                    ("once, recomputed", "today, summed"),
                                                    ("once, grad_and_value", "today, summed"),
                                                    ("today, compiled", "today")])
def test_a_compiled_candidate_equals_the_trainers_eager_pass_b(candidate, trainer):
    chunk = eksft_chunk(rows=16, vocab=64, hidden=16)
    passes = candidates(chunk)
    value, grad = passes[trainer](chunk.logits.clone())
    candidate_value, candidate_grad = passes[candidate](chunk.logits.clone())
    assert relative_error(candidate_value, value) < TOLERANCE
    assert relative_error(candidate_grad, grad) < TOLERANCE
