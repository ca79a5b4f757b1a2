"""The FSDP2 root the trainer steps: the policy plus the frozen models its loss needs, their sharding and precision.

Every decoder layer of every model (policy, reference, old policy) is its own ``fully_shard`` unit; the root unit is
:class:`PolicyWithTokenLoss`, whose ``forward`` runs the trunks *and* the chunked loss head, so the root pre-forward
unshards the head weights (tied to the embeddings in Qwen3-4B) for exactly that call. The model's own full-logits
forward is never used for training: the trunk's final hidden states and the head weight go to
``sft.token_stats.chunked_loss``, the only code that builds ``[tokens x vocab]`` tensors.
"""
from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from transformers import PreTrainedModel

from sft.distributed import DistEnv
from sft.lora import is_lora, refresh_old_adapter
from sft.token_stats import LossResult, TokenStats, TokenWeights, chunked_loss, chunked_statistics


FROZEN_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""``sft.frozen_dtype`` → storage dtype of the frozen models (reference, its cached head, PSFT's old policy)."""


def freeze(model: nn.Module, dtype: str = "fp32") -> nn.Module:
    """``model`` without gradients, in eval mode, its parameters stored in ``dtype`` (:data:`FROZEN_DTYPES`).

    Buffers keep their dtype (RoPE's fp32 ``inv_freq``), as under FSDP2's bf16 ``MixedPrecisionPolicy``, which casts
    parameters only: on a GPU with bf16 mixed precision a bf16-stored frozen model computes exactly what the fp32 one
    computes after FSDP2's cast, with 2 bytes per parameter instead of 4."""
    model.requires_grad_(False)
    for param in model.parameters():
        param.data = param.data.to(FROZEN_DTYPES[dtype])
    return model.eval()


SELECTIVE_SAVED_OPS = tuple(getattr(torch.ops.aten, name).default for name in (
    "mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"))
"""The ops whose outputs selective activation checkpointing keeps (``sft.gradient_checkpointing_policy=selective``):
the matmuls (the projections' ``mm``; ``bmm`` for eager attention) and the attention kernels, torchtitan's op-level
save list, but every matmul kept (torchtitan's op policy recomputes every second ``mm`` for memory). The RMSNorms,
RoPE, SwiGLU's activation and the residual adds are recomputed in the backward: cheap elementwise work against the
matmuls full recompute repeats."""


def checkpoint_decoder_layers(model: PreTrainedModel, policy: str, lora_rank: int = 0) -> None:
    """Activation checkpointing of each decoder layer (``sft.gradient_checkpointing_policy``): ``full`` is HF's
    non-reentrant checkpointing around each layer's call; ``selective`` wraps each layer's ``forward`` in
    ``torch.utils.checkpoint`` with :func:`selective_policy`, inside the module (FSDP2's hooks stay outside the
    recomputed region) and before :func:`compile_decoder_layers`, so ``torch.compile`` traces the checkpoint and
    partitions the layer's forward and backward by that policy, as torchtitan orders them. Layers in eval mode or
    under ``no_grad`` are not checkpointed. ``lora_rank``: the rank of the adapters added after this (0: none)."""
    if policy == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    saving = functools.partial(create_selective_checkpoint_contexts, selective_policy(lora_rank))
    for layer in model.get_decoder().layers:
        layer.forward = _selectively_checkpointed(layer.forward, saving)


def selective_policy(lora_rank: int) -> Callable[..., CheckpointPolicy]:
    """Keep the outputs of :data:`SELECTIVE_SAVED_OPS`, recompute the rest; with LoRA also recompute the ``mm`` that
    contracts over at most ``lora_rank`` (each adapter's B): keeping its output, as wide as the projection's, made a
    layer keep more than no checkpointing at all (docs/results/2026-11-27-sft-memory-estimate-selective.md), and it
    costs ``lora_rank / d`` of the projection's FLOPs to redo."""
    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        low_rank = op is torch.ops.aten.mm.default and args[0].shape[-1] <= lora_rank
        return CheckpointPolicy.MUST_SAVE if op in SELECTIVE_SAVED_OPS and not low_rank \
            else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def _selectively_checkpointed(forward: Callable[..., Any], context_fn: Callable[[], Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        if not (forward.__self__.training and torch.is_grad_enabled()):
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
    return checkpointed


def compile_decoder_layers(model: PreTrainedModel) -> None:
    """Each decoder layer's ``forward`` under ``torch.compile``, per block as torchtitan compiles: its RMSNorms, RoPE,
    SwiGLU and residual adds fuse into a few kernels. The module itself is kept, so FSDP2's hooks and HF's activation
    checkpointing run around the compiled forward (selective checkpointing inside it) and parameter names
    (checkpoints, exports) do not change."""
    for layer in model.get_decoder().layers:
        layer.forward = torch.compile(layer.forward)


def final_hidden_states(model: PreTrainedModel, input_ids: torch.Tensor,
                        attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The trunk's last hidden states ``[B, L, d]`` after the final norm (no logits)."""
    return model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


class PolicyWithTokenLoss(nn.Module):
    """FSDP2 root: the policy plus the frozen models its loss needs; ``forward`` returns the micro-batch loss.

    Called with ``labels=None`` it returns the policy's logits instead (only for the export check). With
    ``reference_head`` instead of ``reference`` (the reference cache), ``forward`` takes the reference's final hidden
    states as ``ref_hidden [B, L, d]`` and applies only that head. With LoRA (``sft.lora``) the policy is a
    ``PeftModel`` and the reference and old policy are :class:`sft.lora.AdapterView` s of its own layers: the base with
    the adapters disabled, and the old adapter, run inside this forward with the policy's frozen head.
    """

    def __init__(self, policy: PreTrainedModel, token_loss: Any, chunk_size: int,
                 reference: PreTrainedModel | None = None, old_policy: PreTrainedModel | None = None,
                 reference_head: nn.Module | None = None, compile_statistics: bool = False,
                 online_statistics: bool = False, compile_pass_b: bool = False, kept_logits_chunks: int = 1):
        super().__init__()
        if reference is not None and reference_head is not None:
            raise ValueError("give the reference model or its cached head, not both")
        self.policy = policy
        self.reference = reference
        self.reference_head = reference_head
        self.old_policy = old_policy
        self.token_loss = token_loss
        self.chunk_size = chunk_size
        self.compile_statistics = compile_statistics
        self.online_statistics = online_statistics
        self.compile_pass_b = compile_pass_b
        self.kept_logits_chunks = kept_logits_chunks

    def models(self) -> list[PreTrainedModel]:
        """The models with layers of their own (a LoRA policy's reference and old policy are views of its layers)."""
        return [m for m in (self.policy, self.reference, self.old_policy) if isinstance(m, nn.Module)]

    def train(self, mode: bool = True) -> "PolicyWithTokenLoss":
        super().train(mode)
        for frozen in (self.reference, self.reference_head, self.old_policy):
            if isinstance(frozen, nn.Module):
                frozen.eval()
        return self

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, ref_hidden: torch.Tensor | None = None, *,
                weights: TokenWeights | None = None, statistics: dict[str, torch.Tensor] | None = None,
                statistics_only: bool = False,
                behaviour_logp: torch.Tensor | None = None) -> LossResult | StepStatistics | torch.Tensor:
        """The micro-batch loss; with ``weights`` (its share of a selection over the optimiser step) and
        ``statistics`` (that selection's statistics of its rows) without pass A.
        ``statistics_only``: no loss, no graph, only the loss's statistics of every row and the reference's hidden
        states, which the step's selection and the micro-batch's loss then share (:class:`StepStatistics`).
        ``ref_hidden`` given: the reference's final hidden states (from ``sft.reference_cache`` or that earlier
        pass), and the reference trunk does not run. ``behaviour_logp``: the batch's behaviour log-probabilities
        (``sft.data.collate``), for a loss that reads them."""
        if labels is None:
            return self.policy(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        frozen = self.frozen_states(input_ids, attention_mask, ref_hidden)
        if statistics_only:
            with torch.no_grad():
                hidden = final_hidden_states(self.policy, input_ids, attention_mask)
                stats = chunked_statistics(self.token_loss, hidden, self.head_weight(), labels,
                                           chunk_size=self.chunk_size,
                                           compile_statistics=self.compile_statistics,
                                           online_statistics=self.online_statistics, behaviour_logp=behaviour_logp,
                                           **frozen)
            return StepStatistics(stats, frozen.get("ref_hidden"))
        hidden = final_hidden_states(self.policy, input_ids, attention_mask)
        return chunked_loss(self.token_loss, hidden, self.head_weight(), labels, chunk_size=self.chunk_size,
                            weights=weights, statistics=statistics, compile_statistics=self.compile_statistics,
                            online_statistics=self.online_statistics, compile_pass_b=self.compile_pass_b,
                            kept_logits_chunks=self.kept_logits_chunks,
                            behaviour_logp=behaviour_logp, **frozen)

    def head_weight(self) -> torch.Tensor:
        """The policy's head weight, read after its trunk's forward: under accelerate's FSDP2 the head is sharded
        with the final norm (and the tied embeddings) in a unit that the trunk's forward unshards, not this root."""
        return self.policy.get_output_embeddings().weight

    @torch.no_grad()
    def frozen_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                      ref_hidden: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The final hidden states and head weights of the frozen models the loss needs (``chunked_loss``'s
        ``ref_*``, ``old_*``)."""
        frozen: dict[str, torch.Tensor] = {}
        if self.reference is not None or self.reference_head is not None:
            if ref_hidden is None and self.reference is None:
                raise ValueError("the reference comes from sft.reference_cache: pass its rows as ref_hidden")
            frozen["ref_hidden"] = final_hidden_states(self.reference, input_ids, attention_mask) \
                if ref_hidden is None else ref_hidden
            frozen["ref_head_weight"] = self.reference_head.weight if self.reference is None \
                else self.reference.get_output_embeddings().weight
        if self.old_policy is not None:
            frozen["old_hidden"] = final_hidden_states(self.old_policy, input_ids, attention_mask)
            frozen["old_head_weight"] = self.old_policy.get_output_embeddings().weight
        return frozen


@dataclass
class StepStatistics:
    """What the pass before a step's selection keeps of one micro-batch (``PolicyWithTokenLoss`` with
    ``statistics_only``): its rows' statistics and the reference's final hidden states (None without a reference)."""

    stats: TokenStats
    ref_hidden: torch.Tensor | None


def shard_models(root: PolicyWithTokenLoss, env: DistEnv, mixed_precision: str) -> None:
    """``fully_shard`` each decoder layer of each model, then the root (embeddings, final norms, heads).

    FSDP2 prefetches, in backward, the unit that ran forward just before the one being differentiated. The frozen
    trunks run before the policy's, so the policy's first layer would all-gather the reference's (or old policy's)
    last layer on every micro-batch, for no gradient; it prefetches the root instead (unsharded already: no-op).
    """
    mesh = init_device_mesh(env.device.type, (env.world_size,))
    policy = mixed_precision_policy(env, mixed_precision)
    for model in root.models():
        for layer in model.get_decoder().layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    # the root's inputs besides the tokens (the step selection's weights and statistics, behaviour_logp) are fp32
    # numbers of the loss head, not activations: FSDP2 would cast them to param_dtype
    fully_shard(root, mesh=mesh, mp_policy=replace(policy, cast_forward_inputs=False))
    root.policy.get_decoder().layers[0].set_modules_to_backward_prefetch([root])


def mixed_precision_policy(env: DistEnv, mixed_precision: str) -> MixedPrecisionPolicy:
    # On GPU FSDP2 casts parameters to bf16 for compute and reduces gradients in fp32; on CPU bf16 autocast does
    # the casting instead (see autocast_context), which this CPU runs 4-5x faster than fp32 matmuls.
    if env.device.type == "cuda" and mixed_precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def autocast_context(env: DistEnv, mixed_precision: str):
    if env.device.type == "cpu" and mixed_precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext()


def sharded_reference_trunk(reference: PreTrainedModel, env: DistEnv, mixed_precision: str,
                            frozen_dtype: str = "fp32") -> Callable[[torch.Tensor], torch.Tensor]:
    """The frozen reference's trunk sharded on its own (each decoder layer, then the trunk) as a no-grad function
    ``input_ids [B, L] → final hidden states``, under the training autocast and parameter dtype: the live
    reference's forward inside :class:`PolicyWithTokenLoss`, for building ``sft.reference_cache``."""
    trunk = freeze(reference, frozen_dtype).get_decoder()
    mesh = init_device_mesh(env.device.type, (env.world_size,))
    policy = mixed_precision_policy(env, mixed_precision)
    for layer in trunk.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(trunk, mesh=mesh, mp_policy=policy)

    @torch.no_grad()
    def hidden_states(input_ids: torch.Tensor) -> torch.Tensor:
        with autocast_context(env, mixed_precision):
            return trunk(input_ids=input_ids.to(env.device), use_cache=False).last_hidden_state

    return hidden_states


def frozen_head_copy(model: PreTrainedModel, dtype: str = "fp32") -> nn.Linear:
    """A frozen ``nn.Linear`` holding a copy of ``model``'s LM-head weight (tied or not), stored in ``dtype``."""
    weight = model.get_output_embeddings().weight
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(weight)
    return freeze(head, dtype)


@torch.no_grad()
def refresh_old_policy(root: PolicyWithTokenLoss) -> None:
    """Copies the policy's (sharded) weights into the old policy: same mesh and placements, so a local copy; with
    LoRA the trained adapter's tensors into the old adapter (``sft.lora.refresh_old_adapter``)."""
    if is_lora(root.policy):
        refresh_old_adapter(root.policy)
        return
    old_params = dict(root.old_policy.named_parameters())
    for name, param in root.policy.named_parameters():
        old_params[name].copy_(param)
