"""Activation checkpointing of the policy's decoder layers (``sft.gradient_checkpointing_policy``) in the trainer's
own FSDP2 root (tiny Qwen3, 1 rank, CPU, eager layers): ``full`` and ``selective`` give the loss and gradients of no
checkpointing, and they differ only in what the backward runs again: full recompute repeats the layers' matmuls,
selective none of the projections (under LoRA only the adapters' rank-r B matmuls). Compiled layers under selective
checkpointing: tests/e2e/test_sft_compile.py."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.sft_step_time import build_trainer, parse_args, release
from common.config.sft import EKSFTMethod, LoRAConfig
from sft.distributed import close_distributed, init_distributed

pytestmark = pytest.mark.integration

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
RECOMPUTED_PER_LAYER = 6
"""The projections full recompute runs again per layer: q, k, v, o, gate and up, not down, whose output the backward
does not read (non-reentrant checkpointing stops its recompute once it has what the backward needs)."""
LORA_RANK = LoRAConfig().rank
"""The adapters' rank ``build_trainer`` adds (``sft.lora.rank``'s default)."""


class MatmulCount(TorchDispatchMode):
    """Counts the matmuls dispatched while active: all, and the low-rank ones (contracting over at most
    :data:`LORA_RANK`: LoRA's B); and SwiGLU's forward ``silu``, which a backward runs only when it recomputes."""

    def __init__(self):
        super().__init__()
        self.count = self.low_rank = self.silu = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            self.count += 1
            self.low_rank += args[0].shape[-1] <= LORA_RANK
        self.silu += func is torch.ops.aten.silu.default
        return func(*args, **(kwargs or {}))


def step(env, checkpointing: str | None, lora: bool):
    """An EKSFT micro-batch's loss, the policy's gradients, the root's decoder layer count and the counts of the
    matmuls its backward ran (:class:`MatmulCount`), with ``checkpointing`` (None: off), full fine-tuning or LoRA."""
    flags = ["--mixed-precision", "fp32", "--seq-len", "16", "--micro-batch-size", "2", "--grad-accum", "1",
             "--chunk-size", "8"]
    if checkpointing is not None:
        flags += ["--gradient-checkpointing", "--gradient-checkpointing-policy", checkpointing]
    root, _, _ = build_trainer(EKSFTMethod(), parse_args(flags), env, lora=lora)
    input_ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = input_ids.clone()
    labels[:, :4] = -100
    result = root(input_ids=input_ids, labels=labels)
    counter = MatmulCount()
    with counter:
        result.loss.backward()
    grads = {name: param.grad.full_tensor() for name, param in root.policy.named_parameters() if param.requires_grad}
    layers = len(root.policy.get_decoder().layers)
    del root
    release(env)
    return result.loss.detach(), grads, layers, (counter.count, counter.low_rank, counter.silu)


@pytest.mark.parametrize("lora", [False, True], ids=["full-fine-tuning", "lora"])
def test_selective_checkpointing_recomputes_no_projection_and_changes_no_number(lora):
    """Under LoRA full recompute repeats the adapters' matmuls too (how many is PEFT's layout; more, is checked), and
    selective repeats each adapter's B, nothing wider."""
    env = init_distributed("cpu")
    try:
        loss, grads, layers, (matmuls, low_rank, silu) = step(env, None, lora)
        outcomes = {policy: step(env, policy, lora) for policy in ("full", "selective")}
    finally:
        close_distributed(env)
    assert len(grads) > 0
    (full, _, _), (selective, selective_low_rank, selective_silu) = outcomes["full"][3], outcomes["selective"][3]
    assert silu == 0 and selective_silu == layers  # the elementwise work is recomputed
    if lora:
        assert full > matmuls + RECOMPUTED_PER_LAYER * layers
        assert selective - matmuls == selective_low_rank - low_rank == RECOMPUTED_PER_LAYER * layers
    else:
        assert full == matmuls + RECOMPUTED_PER_LAYER * layers
        assert selective == matmuls
    for policy, (policy_loss, policy_grads, _, _) in outcomes.items():
        assert torch.allclose(policy_loss, loss, rtol=1e-6, atol=0), policy
        for name, grad in grads.items():
            assert torch.allclose(policy_grads[name], grad, rtol=1e-6, atol=1e-9), (policy, name)


def test_the_policy_is_validated_and_joins_the_identity_only_when_set():
    from common.config import ConfigError, compose
    from common.config.common import computation_config

    assert "gradient_checkpointing_policy" not in computation_config(compose(["profile=paper"]).sft)
    selective = compose(["profile=paper", "sft.gradient_checkpointing_policy=selective"])
    assert computation_config(selective.sft)["gradient_checkpointing_policy"] == "selective"
    with pytest.raises(ConfigError, match=r"sft.gradient_checkpointing_policy must be one of \['full', 'selective'\]"):
        compose(["sft.gradient_checkpointing_policy=ops"])
    with pytest.raises(ConfigError, match="sft.gradient_checkpointing_policy=selective needs "
                                          "sft.gradient_checkpointing=true"):
        compose(["sft.gradient_checkpointing=false", "sft.gradient_checkpointing_policy=selective"])
