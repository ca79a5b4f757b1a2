"""FSDP2 backward prefetching in the SFT root (1-rank gloo group, tiny random Qwen3): the frozen reference and old
policy run forward before the policy, and their layers are never all-gathered during the backward."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

from bench.tiny_model import random_qwen3
from common.config.sft import EKSFTMethod, PSFTMethod
from sft.distributed import close_distributed, init_distributed
from sft.losses import build_loss
from sft.policy import PolicyWithTokenLoss, freeze, shard_models

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("method", [EKSFTMethod(), PSFTMethod()], ids=lambda m: m.name)
def test_no_frozen_layer_is_all_gathered_in_the_backward(monkeypatch, method):
    loss = build_loss(method)
    model = lambda: random_qwen3(vocab_size=64, hidden_size=64, num_layers=2, seed=0)  # noqa: E731
    env = init_distributed("cpu")
    try:
        root = PolicyWithTokenLoss(model(), loss, chunk_size=8,
                                   reference=freeze(model()) if loss.needs_reference else None,
                                   old_policy=freeze(model()) if loss.needs_old_policy else None)
        shard_models(root, env, "fp32")
        frozen = root.reference if root.reference is not None else root.old_policy
        frozen_layers = {id(layer) for layer in frozen.get_decoder().layers}
        in_backward: list[int] = []
        original = FSDPParamGroup.unshard

        def unshard(group, *args, **kwargs):
            if torch._C._current_graph_task_id() != -1:  # inside autograd's backward
                in_backward.extend(id(module) for module in group.modules)
            return original(group, *args, **kwargs)

        monkeypatch.setattr(FSDPParamGroup, "unshard", unshard)
        input_ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
        labels = input_ids.clone()
        labels[:, :4] = -100
        root(input_ids=input_ids, labels=labels).loss.backward()
        policy_layers = {id(layer) for layer in root.policy.get_decoder().layers}
        assert policy_layers <= set(in_backward)  # the policy's layers are unsharded for their gradients
        assert not frozen_layers & set(in_backward)
    finally:
        close_distributed(env)


def test_the_root_keeps_the_step_selection_and_behaviour_logp_in_fp32_under_bf16_parameters(monkeypatch):
    """On a GPU under bf16 FSDP2 casts each floating tensor of a sharded module's forward inputs to bf16. The root's
    inputs besides the tokens are the step selection's coefficients and statistics and the rows' behaviour
    log-probabilities, numbers the loss head reads in fp32; the decoder layers still take bf16 hidden states. Here
    the GPU's policy (bf16 parameters) on the CPU, one rank."""
    import sft.policy
    from torch.distributed.fsdp import MixedPrecisionPolicy

    monkeypatch.setattr(sft.policy, "mixed_precision_policy",
                        lambda env, mixed_precision: MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                         reduce_dtype=torch.float32))
    seen: dict[str, torch.dtype] = {}
    original = sft.policy.chunked_loss

    def recording(loss, hidden, *args, weights=None, statistics=None, behaviour_logp=None, **kwargs):
        seen["hidden"] = hidden.dtype
        seen.update({f"weights.{name}": coef.dtype for name, coef in weights.coefs.items()})
        seen.update({f"statistics.{name}": value.dtype for name, value in statistics.items()})
        seen["behaviour_logp"] = behaviour_logp.dtype
        return original(loss, hidden, *args, weights=weights, statistics=statistics, behaviour_logp=behaviour_logp,
                        **kwargs)

    monkeypatch.setattr(sft.policy, "chunked_loss", recording)
    model = lambda: random_qwen3(vocab_size=64, hidden_size=64, num_layers=2, seed=0)  # noqa: E731
    env = init_distributed("cpu")
    try:
        from sft.trainer import train_step
        from sft.optim import build_optimizer
        from common.config import SFTConfig

        method = EKSFTMethod(selection_scope="optimizer_batch")
        root = PolicyWithTokenLoss(model(), build_loss(method), chunk_size=8, reference=freeze(model()))
        shard_models(root, env, "bf16")
        config = SFTConfig(method=method, micro_batch_size=2, grad_accum=1, chunk_size=8, mixed_precision="fp32")
        input_ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
        labels = input_ids.clone()
        labels[:, :4] = -100
        batch = {"input_ids": input_ids, "attention_mask": None, "labels": labels,
                 "behaviour_logp": torch.full((2, 12), -0.3)}
        train_step(root, build_optimizer(root, config), [batch], sft=config, env=env)
    finally:
        close_distributed(env)
    assert seen.pop("hidden") == torch.bfloat16  # the trunk ran in bf16
    assert seen and set(seen.values()) == {torch.float32}, seen
