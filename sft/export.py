"""FSDP2 policy -> Hugging Face folder (safetensors + tokenizer + generation config), verified by reloading it.

The folder is what RL and vLLM evaluation load, so before it counts as written it must:

* reload with ``AutoModelForCausalLM`` / ``AutoTokenizer`` / ``GenerationConfig`` and have the same parameter count;
* stop generation at the chat template's end-of-turn token (``<|im_end|>`` for Qwen's ChatML): the tokenizer's
  ``eos_token`` is that token and the generation config's ``eos_token_id`` contains its id (trl PR #3299: an SFT'd
  Qwen whose EOS disagreed with the template never stopped generating);
* give the same next-token log-probabilities as the in-memory model on a few training sequences, within a
  tolerance that depends on the export dtype.

It is written to ``hf.tmp/`` and renamed to ``hf/`` only after these checks pass.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from common.models import align_eos, follow_umask, load_causal_lm
from sft.lora import is_adapter_key, is_lora, merged_hf_state_dict

LOGPROB_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.15}
"""Largest allowed |Δ log p| between the reloaded export and the in-memory model, by the lower of the export dtype
and the in-memory model's compute dtype (bf16 keeps 8 significant bits, which moves log-probs by a few hundredths
on real models)."""


class ExportError(RuntimeError):
    """The exported folder failed a check; the message says which."""


def gather_full_state_dict(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: every rank calls it; rank 0 gets the full CPU state dict, the others an empty dict."""
    return get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def write_hf_folder(model_config: Any, state_dict: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase,
                    generation_config: GenerationConfig, folder: Path, dtype: torch.dtype) -> None:
    """Saves ``state_dict`` cast to ``dtype`` as a plain (unwrapped) HF model, plus tokenizer and generation config."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config, dtype=dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in state_dict.items()}, strict=True, assign=True)
    model.tie_weights()
    model.config.dtype = dtype
    model.generation_config = generation_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    follow_umask(folder)


def verify_hf_folder(folder: Path, *, sequences: list[torch.Tensor], expected_logprobs: list[torch.Tensor],
                     end_of_turn: str, num_parameters: int, dtype: torch.dtype, tolerance: float,
                     device: torch.device) -> dict[str, Any]:
    """Reloads ``folder`` with transformers and checks it against the in-memory model (raises :class:`ExportError`)."""
    model = load_causal_lm(folder, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)  # as saved: the eos check below must see the file's
    generation_config = GenerationConfig.from_pretrained(folder)
    reloaded_params = sum(p.numel() for p in model.parameters())
    if reloaded_params != num_parameters:
        raise ExportError(f"{folder}: reloaded model has {reloaded_params} parameters, trained one {num_parameters}")
    if tokenizer.eos_token != end_of_turn:
        raise ExportError(f"{folder}: tokenizer eos {tokenizer.eos_token!r} is not the end-of-turn {end_of_turn!r}")
    end_id = tokenizer.convert_tokens_to_ids(end_of_turn)
    eos_ids = generation_config.eos_token_id
    if end_id not in ([eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])):
        raise ExportError(f"{folder}: generation_config eos_token_id {eos_ids} lacks {end_of_turn!r} ({end_id})")
    max_diff = 0.0
    with torch.no_grad():
        for input_ids, expected in zip(sequences, expected_logprobs):
            logits = model(input_ids=input_ids.to(device), use_cache=False).logits
            diff = (logits.float().log_softmax(-1).cpu() - expected).abs().max().item()
            max_diff = max(max_diff, diff)
    if not max_diff <= tolerance:
        raise ExportError(f"{folder}: reloaded log-probs differ from the in-memory model by {max_diff:.3g} "
                          f"(> {tolerance} allowed)")
    return {"max_abs_logprob_diff": max_diff, "tolerance": tolerance, "num_parameters": reloaded_params,
            "end_of_turn": end_of_turn,
            "eos_token_id": generation_config.eos_token_id, "dtype": str(dtype).removeprefix("torch.")}


def export_hf(policy_logprobs: Callable[[torch.Tensor], torch.Tensor], policy: torch.nn.Module, *,
              tokenizer: PreTrainedTokenizerBase, generation_config: GenerationConfig, sequences: list[torch.Tensor],
              folder: Path, dtype: torch.dtype, compute_dtype: torch.dtype, is_main: bool, device: torch.device,
              announce: Callable[[str], None] = print, adapter_folder: Path | None = None) -> dict[str, Any] | None:
    """Collective export of the FSDP2-sharded ``policy`` to ``folder`` in ``dtype``; returns the check record on rank 0.
    A LoRA policy (``sft.lora``) is exported merged, and its trained adapter alone goes to ``adapter_folder``.

    ``policy_logprobs(input_ids)`` runs the in-memory (sharded) model on one sequence on every rank and returns its
    next-token log-probabilities ``[1, L, V]`` in float32; ``compute_dtype`` is the precision that forward ran in.
    """
    expected = [policy_logprobs(ids).cpu() for ids in sequences]
    state_dict = gather_full_state_dict(policy)
    if not is_main:
        return None
    if is_lora(policy):
        adapter_staging = adapter_folder.with_name(adapter_folder.name + ".tmp")
        shutil.rmtree(adapter_staging, ignore_errors=True)
        state_dict = merged_hf_state_dict(policy, state_dict, adapter_dir=adapter_staging)
    previous_eos = tokenizer.eos_token
    if align_eos(tokenizer, generation_config).tokenizer:
        announce(f"[export] tokenizer eos {previous_eos!r} differs from the chat template's end-of-turn "
                 f"{tokenizer.eos_token!r}; exporting with eos {tokenizer.eos_token!r}")
    end_of_turn = tokenizer.eos_token
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    write_hf_folder(policy.config, state_dict, tokenizer, generation_config, staging, dtype)
    record = verify_hf_folder(staging, sequences=sequences, expected_logprobs=expected, end_of_turn=end_of_turn,
                              num_parameters=policy_parameter_count(policy), dtype=dtype, device=device,
                              tolerance=max(LOGPROB_TOLERANCE[dtype], LOGPROB_TOLERANCE[compute_dtype]))
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    if is_lora(policy):
        shutil.rmtree(adapter_folder, ignore_errors=True)
        adapter_staging.rename(adapter_folder)
        record["adapter"] = adapter_folder.name
    return record


def policy_parameter_count(policy: torch.nn.Module) -> int:
    """Parameters of the (possibly sharded) policy without LoRA adapters (merged into the export), each tied tensor
    counted once."""
    return sum(p.numel() for name, p in policy.named_parameters() if not is_adapter_key(name))
