"""Every registered token loss (EKSFT and the baselines of :mod:`sft.losses`) inside TRL's ``SFTTrainer``.

``from sft.integrations.trl import TokenLossSFTTrainer``, then
``TokenLossSFTTrainer(model, args=SFTConfig(...), train_dataset=..., token_loss="eksft", token_loss_options={...})``.

What it does (docs/trl.md):

* the loss comes from the one registry (``build_loss``), computed by the project's chunked head
  (``sft.token_stats.chunked_loss``, never ``[tokens × vocab]`` logits) through :class:`sft.policy.PolicyWithTokenLoss`,
  the FSDP2 root forward of the project's own trainer, called from inside the policy's (patched) root forward as TRL's
  own chunked head is: the same code under one process, DDP and FSDP2;
* the frozen reference is ``ref_model``, else a PEFT model's base with its adapters disabled, else a frozen copy of
  the model as given; the old policy of PSFT is a frozen copy refreshed by a callback every
  ``old_policy_refresh_every`` optimiser steps; both prepared as TRL prepares its reference models;
* each micro-batch returns its share ``w_m · world_size · L_m`` of the step objective (``sft.trainer.micro_batch_weight``
  with ``N = num_items_in_batch``, the step's supervised tokens over every rank) and the ``Trainer`` divides by nothing,
  so with ``loss_norm=global_token_mean`` a token-mean loss gives the same update at any gradient accumulation and
  world size;
* the loss's metrics (``ce``, EKSFT's set sizes, entropy and KL on M, IoU, ...) go to TRL's logged metrics as
  ``stats/<name>``, averaged over ranks.
"""
from __future__ import annotations

import copy
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from accelerate.utils import is_peft_model
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule
from transformers import AutoModelForCausalLM, PreTrainedModel, TrainerCallback
from transformers.utils import ModelOutput
from trl import SFTConfig, SFTTrainer
from trl.models import prepare_fsdp

from common.config.common import ConfigError, check_choice, check_range
from common.config.sft import CHECKPOINTING_POLICIES, LOSS_NORMS, SFTMethod
from common.paths import sft_stat_key
from sft.data import supervised_token_count
from sft.lora import AdapterView, refuse_adapted_embeddings
from sft.losses import TokenLoss, build_loss, method_config
from sft.policy import PolicyWithTokenLoss, checkpoint_decoder_layers, freeze, refresh_old_policy
from sft.trainer import micro_batch_weight


@dataclass
class TokenLossOutput(ModelOutput):
    """What the patched root forward returns for a training micro-batch: its objective and the loss's metrics."""

    loss: Tensor | None = None
    metrics: dict[str, Tensor] | None = None


class TokenLossSFTTrainer(SFTTrainer):
    """``SFTTrainer`` whose loss is ``token_loss`` (a registered name or its ``common.config.sft`` config;
    ``token_loss_options`` override its fields), computed ``chunk_size`` tokens at a time.

    ``ref_model``: the frozen reference (a model, or an HF id or folder) of a loss that ``needs_reference``; None: the
    base of a PEFT model with its adapters disabled, or a frozen copy of ``model`` as given. ``loss_norm``: how
    micro-batch objectives make the step objective (``sft.loss_norm``; a method's own, EKSFT official_code's
    micro_batch_sum, wins). ``compile_statistics``, ``online_statistics``, ``compile_pass_b``, ``kept_logits_chunks``:
    the loss head's passes as the ``sft.*`` keys of those names (docs/loss_head.md).
    ``gradient_checkpointing_policy``: what ``args.gradient_checkpointing`` recomputes, as
    ``sft.gradient_checkpointing_policy`` (``selective``: the project's per-layer checkpoint,
    ``sft.policy.checkpoint_decoder_layers``, instead of HF's). Refused, each with one line: packing and padding-free
    batches, Liger, TRL's own ``loss_type="dft"`` or a ``compute_loss_func``, LoRA on ``lm_head`` or ``embed_tokens``,
    EKSFT ``selection_scope=optimizer_batch``, SED-SFT's calibration, ``selective`` checkpointing without
    ``gradient_checkpointing``, DeepSpeed and FSDP1.
    """

    loss_is_scaled_for_ga = True
    """TRL ≥ 1.13's name for what ``model_accepts_loss_kwargs=True`` says here: each micro-batch's loss is already its
    share of the step objective, the ``Trainer`` must not divide it by the gradient-accumulation steps."""

    def __init__(self, model: str | PreTrainedModel, args: SFTConfig | None = None, *,
                 token_loss: str | SFTMethod = "eksft", token_loss_options: dict[str, Any] | None = None,
                 ref_model: str | PreTrainedModel | None = None, chunk_size: int = 256,
                 loss_norm: str = "global_token_mean", compile_statistics: bool = False,
                 online_statistics: bool = False, compile_pass_b: bool = False, kept_logits_chunks: int = 1,
                 gradient_checkpointing_policy: str = "full",
                 **trainer_kwargs: Any):
        loss = build_loss(method_config(token_loss, **(token_loss_options or {})))
        check_choice("loss_norm", loss_norm, LOSS_NORMS)
        check_choice("gradient_checkpointing_policy", gradient_checkpointing_policy, CHECKPOINTING_POLICIES)
        check_range("kept_logits_chunks", kept_logits_chunks, 1)
        args = args if args is not None else SFTConfig(loss_type="nll")
        _refuse_unsupported(loss, args, trainer_kwargs, ref_model, gradient_checkpointing_policy)
        args.loss_type = "nll"  # TRL's own chunked head stays unpatched: the token loss's head replaces it
        selective = gradient_checkpointing_policy == "selective"
        if selective:  # the Trainer must not wrap the layers in HF's checkpointing too
            args.gradient_checkpointing = False
        super().__init__(model, args=args, **trainer_kwargs)
        if self.is_deepspeed_enabled or (self.is_fsdp_enabled and self.accelerator.state.fsdp_plugin.fsdp_version != 2):
            raise ConfigError("TokenLossSFTTrainer runs on one process, DDP or FSDP2 (fsdp_version: 2); not DeepSpeed "
                              "or FSDP1")
        self.model_accepts_loss_kwargs = True  # count num_items_in_batch, never divide by the accumulation steps
        self.loss_norm = loss.cfg.own_loss_norm() or loss_norm
        self.token_loss = loss

        policy = self.model
        is_peft = is_peft_model(policy)
        trunk_owner = policy.get_base_model() if is_peft else policy
        if is_peft:
            refuse_adapted_embeddings(trunk_owner, "TokenLossSFTTrainer")
        if selective:
            lora_rank = policy.peft_config[policy.active_adapter].r if is_peft else 0
            checkpoint_decoder_layers(trunk_owner, gradient_checkpointing_policy, lora_rank)
        reference = old_policy = None
        if loss.needs_reference:
            if ref_model is None and is_peft:
                reference = AdapterView(policy)  # the base: every adapter disabled
            else:
                reference = self._prepare_frozen(_load_like(ref_model, trunk_owner) if ref_model is not None
                                                 else copy.deepcopy(trunk_owner))
        if loss.needs_old_policy:
            old_policy = self._prepare_frozen(copy.deepcopy(trunk_owner))
        self.loss_root = PolicyWithTokenLoss(trunk_owner, loss, chunk_size, reference=reference, old_policy=old_policy,
                                             compile_statistics=compile_statistics,
                                             online_statistics=online_statistics, compile_pass_b=compile_pass_b,
                                             kept_logits_chunks=kept_logits_chunks)
        """The project trainer's root forward (trunks, chunked head); its ``policy`` is the model TRL trains."""
        _patch_root_forward(trunk_owner, self.loss_root)
        self.add_callback(_TokenLossSteps(self.loss_root))

    def _prepare_frozen(self, model: PreTrainedModel) -> nn.Module:
        """A frozen model prepared as TRL prepares its reference models (``GRPOTrainer``): FSDP2-sharded under FSDP,
        else placed by ``accelerator.prepare_model(evaluation_mode=True)``."""
        freeze(model)
        if self.is_fsdp_enabled:
            return prepare_fsdp(model, self.accelerator)
        return self.accelerator.prepare_model(model, evaluation_mode=True)

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Tensor | int | None = None):
        mode = "train" if self.model.training else "eval"
        labels = inputs["labels"]
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"), labels=labels,
                        token_loss=True)
        self._log_loss_metrics(mode, outputs.metrics, inputs)
        loss = outputs.loss
        if mode == "train" and num_items_in_batch is not None:
            loss = loss * self._rank_share(labels, num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def _rank_share(self, labels: Tensor, num_items_in_batch: Tensor | int) -> float:
        """``world_size · w_m`` (``sft.trainer.micro_batch_weight``): DDP and FSDP average gradients over ranks, so
        each rank back-propagates ``world_size · w_m · L_m`` and the step's gradient is that of ``Σ_ranks Σ_m w_m L_m``."""
        step_tokens = torch.as_tensor(num_items_in_batch, device=labels.device)
        if not self.args.average_tokens_across_devices:  # the Trainer counted this rank's micro-batches only
            step_tokens = self.accelerator.reduce(step_tokens, reduction="sum")
        world_size = self.accelerator.num_processes
        weight = micro_batch_weight(self.loss_norm, num_tokens=supervised_token_count(labels),
                                    step_tokens=int(step_tokens), grad_accum=self.current_gradient_accumulation_steps,
                                    world_size=world_size)
        return weight * world_size

    def _log_loss_metrics(self, mode: str, metrics: dict[str, Tensor], inputs: dict[str, Any]) -> None:
        """The loss's metrics, averaged over ranks, into TRL's ``_metrics`` (averaged over micro-batches at each log),
        and TRL's running ``num_tokens``; one gather per micro-batch."""
        names = sorted(metrics)
        attention_mask = inputs.get("attention_mask")
        input_tokens = inputs["input_ids"].numel() if attention_mask is None else attention_mask.sum()
        device = inputs["input_ids"].device
        values = torch.stack([metrics[name].detach().float().to(device) for name in names]
                             + [torch.as_tensor(input_tokens, dtype=torch.float32, device=device)])
        gathered = self.accelerator.gather(values.unsqueeze(0)).reshape(-1, len(values))
        means = gathered[:, :-1].mean(0).tolist()
        for name, value in zip(names, means):
            self._metrics[mode][sft_stat_key(name)].append(value)
        if mode == "train":
            self._total_train_tokens += int(gathered[:, -1].sum())
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]


class _TokenLossSteps(TrainerCallback):
    """Before each optimiser step: the loss's step (per-step randomness), and PSFT's old-policy refresh every
    ``old_policy_refresh_every`` steps (``sft.policy.refresh_old_policy``, as the project trainer does)."""

    def __init__(self, loss_root: PolicyWithTokenLoss):
        self.loss_root = loss_root

    def on_step_begin(self, args, state, control, **kwargs):
        loss = self.loss_root.token_loss
        loss.begin_step(state.global_step)
        if self.loss_root.old_policy is not None and state.global_step % loss.old_policy_refresh_every == 0:
            refresh_old_policy(self.loss_root)


def _patch_root_forward(model: PreTrainedModel, loss_root: PolicyWithTokenLoss) -> None:
    """``model(..., labels=..., token_loss=True)`` runs ``loss_root`` inside ``model``'s own forward (so DDP's and the
    FSDP root's hooks run around it, as around TRL's own chunked head); any other call is the model's forward."""
    original_forward = model.forward

    def forward(*args: Any, token_loss: bool = False, **kwargs: Any):
        if not token_loss:
            return original_forward(*args, **kwargs)
        with _gathered(loss_root.reference, loss_root.old_policy):
            result = loss_root(kwargs["input_ids"], kwargs.get("attention_mask"), kwargs["labels"])
        return TokenLossOutput(loss=result.loss, metrics=result.metrics)

    model.forward = forward


@contextmanager
def _gathered(*models: Any) -> Iterator[None]:
    """The FSDP2-sharded frozen models among ``models`` unsharded for the block: the project's root forward calls
    their trunks and heads directly, not through their own root forward."""
    with ExitStack() as stack:
        for model in models:
            if isinstance(model, FSDPModule):
                model.unshard()
                stack.callback(model.reshard)
        yield


def _load_like(ref_model: str | PreTrainedModel, policy: PreTrainedModel) -> PreTrainedModel:
    if isinstance(ref_model, str):
        return AutoModelForCausalLM.from_pretrained(ref_model, dtype=policy.dtype)
    return ref_model


def _refuse_unsupported(loss: TokenLoss, args: SFTConfig, trainer_kwargs: dict[str, Any],
                        ref_model: Any, gradient_checkpointing_policy: str) -> None:
    """One line for each setting the token losses cannot honour, before any model is built."""
    refusals = [
        (args.packing or args.padding_free, "packing / padding_free put several sequences in one row: the losses "
                                            "select and normalise per row; set packing=False, padding_free=False"),
        (args.use_liger_kernel, "use_liger_kernel: Liger's fused cross-entropy replaces the head the token loss "
                                "needs; set use_liger_kernel=False"),
        (args.loss_type == "dft", "loss_type='dft' is TRL's own loss; pass token_loss='dft' instead"),
        ("compute_loss_func" in trainer_kwargs, "compute_loss_func: the token loss is the loss; drop it"),
        (loss.selects_over_step, "selection_scope=optimizer_batch selects over the whole optimiser step, which the "
                                 "Trainer's micro-batch loop cannot; use micro_batch or sequence"),
        (loss.calibration() is not None, f"token loss {loss.name!r} calibrates before training, not supported here; "
                                         "set threshold_calibration=none"),
        (ref_model is not None and not loss.needs_reference, f"token loss {loss.name!r} uses no reference; drop "
                                                             "ref_model"),
        (gradient_checkpointing_policy != "full" and not args.gradient_checkpointing,
         f"gradient_checkpointing_policy={gradient_checkpointing_policy} needs gradient_checkpointing=True"),
    ]
    for refused, message in refusals:
        if refused:
            raise ConfigError(f"TokenLossSFTTrainer: {message}")
