"""``sft.frozen_dtype=bf16`` changes no number on a GPU under bf16 mixed precision: FSDP2 computes the policy from
bf16 casts of its fp32 weights, which are the bf16 reference's weights, so EKSFT's KL at step 0 is exactly 0 and its
KL mask empty, as with an fp32 reference (on a CPU it is not: tests/integration/test_sft_compiled.py)."""
from __future__ import annotations

import pytest
import torch

from bench.sft_step_time import parse_args
from sft.distributed import close_distributed, init_distributed
from sft_helpers import step_zero_kl

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make test-gpu)")]


def test_a_bf16_reference_is_the_bf16_policy_at_step_0():
    env = init_distributed("cuda")
    try:
        for frozen_dtype in ("fp32", "bf16"):
            args = parse_args(["--device", "cuda", "--mixed-precision", "bf16", "--frozen-dtype", frozen_dtype,
                               "--seq-len", "64", "--micro-batch-size", "2", "--grad-accum", "1"])
            assert step_zero_kl(args, env) == (0.0, 0.0), frozen_dtype
    finally:
        close_distributed(env)
