"""The compiled trainer against the eager one on CPU where compiling takes too long for the default suite (``make
test-e2e``): the statistics pass of every loss of the registry (``sft.compile_statistics``; 5-30 s each on 2 cores),
and compiled decoder layers (``sft.compile_layers``; inductor compiles a Qwen3 layer's forward and backward in
about a minute)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from bench.sft_step_time import build_trainer, parse_args, release
from common.config.sft import EKSFTMethod
from sft.distributed import close_distributed, init_distributed
from sft.losses import build_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_sft_compiled import (METHOD_CONFIGS, STATISTICS_CONFIGS, check_compiled_head,  # noqa: E402
                                relative_error)


@pytest.fixture(autouse=True)
def fresh_dynamo_cache():
    torch._dynamo.reset()  # each config compiles its own kernels, never the recompile limit's eager fallback
    yield


@pytest.mark.parametrize("cfg", STATISTICS_CONFIGS, ids=lambda c: f"{c.name}-{'-'.join(build_loss(c).stats)}")
def test_compiled_statistics_pass_equals_the_eager_pass(cfg):
    check_compiled_head(cfg, compile_statistics=True)


@pytest.mark.parametrize("cfg", METHOD_CONFIGS, ids=lambda c: f"{c.name}-{getattr(c, 'compat', '')}-"
                                                              f"{getattr(c, 'stats_dtype', '')}")
def test_compiled_pass_b_equals_the_eager_pass_b(cfg):
    """``sft.compile_pass_b`` for every registered loss: each one's objective terms and their gradients, compiled."""
    check_compiled_head(cfg, compile_pass_b=True)


def test_compiled_decoder_layers_match_eager_loss_and_gradients():
    """``compile_decoder_layers`` (inductor on CPU): the EKSFT trainer's loss and policy gradients equal the eager
    trainer's within fp32 round-off; parameter names do not change."""
    env = init_distributed("cpu")
    try:
        outcomes = []
        for compiled in (False, True):
            args = parse_args(["--mixed-precision", "fp32", "--seq-len", "16", "--micro-batch-size", "2",
                               "--grad-accum", "1", "--chunk-size", "8"] + (["--compile-layers"] if compiled else []))
            root, _, _ = build_trainer(EKSFTMethod(), args, env)
            names = [name for name, _ in root.named_parameters()]
            input_ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
            labels = input_ids.clone()
            labels[:, :4] = -100
            result = root(input_ids=input_ids, labels=labels)
            result.loss.backward()
            grads = {name: p.grad.full_tensor() for name, p in root.policy.named_parameters()}
            outcomes.append((names, result.loss.detach(), grads))
            del root
            release(env)
        (eager_names, eager_loss, eager_grads), (names, loss, grads) = outcomes
        assert names == eager_names
        assert relative_error(loss, eager_loss) < 1e-5
        for name, grad in eager_grads.items():
            assert relative_error(grads[name], grad) < 1e-4, name
    finally:
        close_distributed(env)




@pytest.mark.parametrize("lora", [False, True], ids=["full-fine-tuning", "lora"])
def test_selectively_checkpointed_compiled_layers_match_eager_and_recompute_no_matmul(lora):
    """``sft.gradient_checkpointing_policy=selective`` with ``sft.compile_layers``: inductor traces the checkpoint
    inside each compiled layer and keeps what the policy saves, so a warm step's backward runs the matmuls of the
    eager trainer without checkpointing, no more (under LoRA, whose adapters' B matmuls are recomputed, the
    gradients only); loss and gradients equal within fp32 round-off."""
    from torch.profiler import profile

    env = init_distributed("cpu")
    try:
        outcomes = []
        for flags in ([], ["--compile-layers", "--gradient-checkpointing", "--gradient-checkpointing-policy",
                           "selective"]):
            args = parse_args(["--mixed-precision", "fp32", "--seq-len", "16", "--micro-batch-size", "2",
                               "--grad-accum", "1", "--chunk-size", "8"] + flags)
            root, _, _ = build_trainer(EKSFTMethod(), args, env, lora=lora)
            input_ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
            labels = input_ids.clone()
            labels[:, :4] = -100
            root(input_ids=input_ids, labels=labels).loss.backward()  # compiles
            root.zero_grad()
            result = root(input_ids=input_ids, labels=labels)
            with profile() as profiled:
                result.loss.backward()
            matmuls = sum(event.count for event in profiled.key_averages() if event.key == "aten::mm")
            grads = {name: p.grad.full_tensor() for name, p in root.policy.named_parameters() if p.requires_grad}
            outcomes.append((result.loss.detach(), grads, matmuls))
            del root
            release(env)
        (eager_loss, eager_grads, eager_matmuls), (loss, grads, matmuls) = outcomes
        assert matmuls > 0 and (lora or matmuls == eager_matmuls)
        assert relative_error(loss, eager_loss) < 1e-5
        for name, grad in eager_grads.items():
            assert relative_error(grads[name], grad) < 1e-4, name
    finally:
        close_distributed(env)
