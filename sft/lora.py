"""LoRA on the policy (``sft.lora``): the adapters train, the base stays frozen and is the loss's reference.

With LoRA the policy is a ``peft.PeftModel`` holding adapter ``"default"`` (trained, float32) on every
``sft.lora.target_modules`` linear layer of the base; the update of a target weight ``W`` is ``ΔW = (α / r) · B A``.
Applied on the meta device before ``fully_shard`` (each decoder layer one unit, adapters included), so every rank
holds its shards of the adapters too. The frozen models a loss needs are views of that one model, never copies:

* the reference is the base with every adapter disabled (:class:`AdapterView` with ``adapter=None``), inside the
  root forward, with the same frozen LM head: exactly the base model;
* PSFT's old policy is a second adapter ``"old"``, frozen, refreshed by copying the ``"default"`` adapter's tensors
  (:func:`refresh_old_adapter`; same shapes and placements, so a local copy of the shards).

The export merges ``W + (α / r) · B A`` into a plain HF model (:func:`merged_hf_state_dict`), and can save the
adapter alone, the PEFT folder verl's ``lora_adapter_path`` reads.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from common.config.common import ConfigError
from common.config.sft import LoRAConfig

TRAINED_ADAPTER = "default"
"""The adapter that trains (PEFT's default name)."""
OLD_ADAPTER = "old"
"""PSFT's old policy: a frozen copy of the trained adapter."""


def lora_config(settings: LoRAConfig) -> LoraConfig:
    """PEFT's ``LoraConfig`` of ``sft.lora``."""
    return LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                      target_modules=list(settings.target_modules), bias="none", task_type="CAUSAL_LM")


def add_lora(model: PreTrainedModel, settings: LoRAConfig, *, old_adapter: bool = False,
             frozen_dtype: torch.dtype = torch.float32) -> PeftModel:
    """``model`` with the trained float32 adapter (and, for PSFT, the frozen ``"old"`` one) on every target; every
    other parameter frozen and stored in ``frozen_dtype`` (``sft.frozen_dtype``: the base is the reference). On the
    meta device it costs nothing; on a loaded model the adapters are initialised as PEFT does (``A`` Kaiming-uniform,
    ``B`` zero: the adapted model starts as the base)."""
    peft_model = get_peft_model(model, lora_config(settings))
    if old_adapter:
        peft_model.add_adapter(OLD_ADAPTER, lora_config(settings))
    refuse_adapted_embeddings(peft_model.get_base_model(), "sft.lora.target_modules")
    for param in peft_model.parameters():
        if not param.requires_grad:
            param.data = param.data.to(frozen_dtype)
    return peft_model


def is_lora(model: nn.Module) -> bool:
    return isinstance(model, PeftModel)


class AdapterView:
    """A frozen model that is ``peft_model`` with ``adapter`` the only active one (None: every adapter disabled, the
    base): its trunk runs the shared layers in that state, its head is the base's frozen head. A plain object, not a
    module, so it holds no parameters of its own."""

    def __init__(self, peft_model: PeftModel, adapter: str | None = None):
        self.peft_model = peft_model
        self.adapter = adapter

    @contextmanager
    def active(self) -> Iterator[None]:
        if self.adapter is None:
            with self.peft_model.disable_adapter():
                yield
            return
        trained = self.peft_model.active_adapter
        self.peft_model.set_adapter(self.adapter, inference_mode=True)
        try:
            yield
        finally:
            self.peft_model.set_adapter(trained)

    def get_decoder(self):
        decoder = self.peft_model.get_base_model().get_decoder()

        def trunk(**inputs: Any):
            with self.active():
                return decoder(**inputs)

        return trunk

    def get_output_embeddings(self) -> nn.Module:
        return self.peft_model.get_base_model().get_output_embeddings()


def adapter_parameters(peft_model: PeftModel, adapter: str) -> dict[str, nn.Parameter]:
    """The parameters of ``adapter``, by name with the adapter's name removed (so two adapters' names match)."""
    marker = f".{adapter}."
    return {name.replace(marker, "."): param for name, param in peft_model.named_parameters(remove_duplicate=False)
            if marker in name and "lora_" in name}


@torch.no_grad()
def refresh_old_adapter(peft_model: PeftModel) -> None:
    """PSFT's old policy ← the policy: the trained adapter's tensors copied into the ``"old"`` adapter."""
    old = adapter_parameters(peft_model, OLD_ADAPTER)
    for name, param in adapter_parameters(peft_model, TRAINED_ADAPTER).items():
        old[name].copy_(param)


def is_adapter_key(name: str) -> bool:
    """A state-dict key of an adapter tensor (any adapter), not of the frozen base."""
    return ".lora_" in name


def merged_hf_state_dict(peft_model: PeftModel, state_dict: dict[str, torch.Tensor],
                         adapter_dir: Path | None = None) -> dict[str, torch.Tensor]:
    """The plain HF state dict of the trained policy: ``W + (α / r) · B A`` merged into every target weight
    (``merge_and_unload``), from ``state_dict``, the gathered full state dict of ``peft_model``. With ``adapter_dir``
    the trained adapter alone is saved there first (``adapter_config.json`` + ``adapter_model.safetensors``)."""
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(peft_model.config, dtype=torch.float32)
    rebuilt = get_peft_model(base, peft_model.peft_config[TRAINED_ADAPTER])
    trained = {name: tensor for name, tensor in state_dict.items() if f".{OLD_ADAPTER}." not in name}
    rebuilt.load_state_dict(trained, strict=True, assign=True)
    rebuilt.get_base_model().tie_weights()
    if adapter_dir is not None:
        rebuilt.save_pretrained(adapter_dir)
    return rebuilt.merge_and_unload().state_dict()


def refuse_adapted_embeddings(model: PreTrainedModel, who: str) -> None:
    """The chunked head reads the head weight (tied to the embeddings in small Qwen3) directly: a PEFT adapter or
    wrapper on either would be silently dropped. ``who`` names the setting in the one-line error."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    for role, module in (("lm_head", model.get_output_embeddings()), ("embed_tokens", model.get_input_embeddings())):
        if isinstance(module, (BaseTunerLayer, AuxiliaryTrainingWrapper)):
            raise ConfigError(f"{who}: {role} is wrapped by PEFT ({type(module).__name__}): the chunked head reads "
                              f"its weight directly; leave {role} out of the PEFT config's target_modules, "
                              "modules_to_save and trainable_token_indices")
