"""``sft.compile_pass_b`` on a GPU: the chunked head's loss and gradients with pass B compiled equal the eager pass
B's at the Qwen3 vocabulary in bf16 (the CPU tiers check fp32 at tiny shapes)."""
from __future__ import annotations

import pytest
import torch

from common.config.sft import EKSFTMethod
from sft.losses import build_loss
from sft.token_stats import chunked_loss

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make test-gpu)")]


def test_compiled_pass_b_equals_the_eager_pass_b_on_a_gpu():
    """EKSFT, 2 × 1,500 tokens (3 chunks of 1,024, the last one padded), bf16 head weights of 151,936 × 2,048 as
    FSDP2 hands them over, the online statistics pass A: loss within 1e-5 and both gradients within 1e-3 (bf16
    GEMMs of the same logit gradients) of the eager pass's."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(2, 1500, 2048, generator=generator, device="cuda").bfloat16()
    weight = (0.02 * torch.randn(151_936, 2048, generator=generator, device="cuda")).bfloat16()
    ref_hidden = (hidden.float() + 0.1 * torch.randn(hidden.shape, generator=generator, device="cuda")).bfloat16()
    labels = torch.randint(0, 151_936, (2, 1500), generator=generator, device="cuda")
    labels[:, :100] = -100
    loss = build_loss(EKSFTMethod())
    results = {}
    for compiled in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        result = chunked_loss(loss, h, w, labels, chunk_size=1024, ref_hidden=ref_hidden, ref_head_weight=weight,
                              compile_statistics=True, online_statistics=True, compile_pass_b=compiled)
        result.loss.backward()
        results[compiled] = (result.loss.detach().float(), h.grad.float(), w.grad.float())
    (loss_e, h_e, w_e), (loss_c, h_c, w_c) = results[False], results[True]
    assert ((loss_c - loss_e).abs() / loss_e.abs()).item() < 1e-5
    for compiled_grad, eager_grad in ((h_c, h_e), (w_c, w_e)):
        assert ((compiled_grad - eager_grad).abs().max() / eager_grad.abs().max()).item() < 1e-3
