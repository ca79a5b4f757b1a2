"""Loading a causal LM and its tokenizer the same way in every stage, whatever the source.

A source is a hub id, a local HF folder, or a GGUF file inside a folder (``gguf_file``); all go through
``from_pretrained`` (transformers dequantises GGUF weights with the ``gguf`` package). The tokenizer's ``eos_token``
is set to the chat template's end-of-turn token, because that is where a response ends for SFT labels and for
generation: GGUF conversions can carry the wrong one (SmolLM2's reports ``<|im_start|>``), and Qwen base models
report ``<|endoftext|>`` while their template closes turns with ``<|im_end|>``.

torch and transformers are imported inside the functions: evaluation sets vLLM's CPU environment before either is
first imported.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

_PROBE = "END_OF_TURN_PROBE"


class ChatTemplateError(ValueError):
    """The tokenizer has no chat template, or its template does not close an assistant turn with a special token."""


class EosAlignment(NamedTuple):
    """Which of the two objects :func:`align_eos` changed."""

    tokenizer: bool
    generation_config: bool


def end_of_turn_token(tokenizer: Any) -> str:
    """The first special token the chat template writes after an assistant message (``<|im_end|>`` for ChatML)."""
    if not tokenizer.chat_template:
        raise ChatTemplateError("the tokenizer has no chat template, so the end-of-turn token cannot be found")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"},
                                          {"role": "assistant", "content": _PROBE}], tokenize=False)
    suffix = text[text.rindex(_PROBE) + len(_PROBE):]
    special_ids = set(tokenizer.all_special_ids) | {
        token_id for token_id, token in tokenizer.added_tokens_decoder.items() if token.special}
    for token_id in tokenizer(suffix, add_special_tokens=False)["input_ids"]:
        if token_id in special_ids:
            return tokenizer.convert_ids_to_tokens(token_id)
    raise ChatTemplateError(f"no special token follows the assistant message in the chat template (suffix "
                            f"{suffix!r}); cannot tell where a response ends")


def align_eos(tokenizer: Any, generation_config: Any) -> EosAlignment:
    """Makes generation stop where a response ends, for an exported model folder.

    With E the chat template's end-of-turn token (:func:`end_of_turn_token`): the tokenizer's ``eos_token`` becomes
    E, the generation config's ``eos_token_id`` becomes ``[id(E), *its other ids in their order]`` (a list, also
    when it held one id or none), and its ``pad_token_id``, when unset, the tokenizer's.
    """
    end_of_turn = end_of_turn_token(tokenizer)
    end_id = tokenizer.convert_tokens_to_ids(end_of_turn)
    tokenizer_changed = tokenizer.eos_token != end_of_turn
    if tokenizer_changed:
        tokenizer.eos_token = end_of_turn
    eos_ids = generation_config.eos_token_id
    eos_ids = [] if eos_ids is None else [eos_ids] if isinstance(eos_ids, int) else list(eos_ids)
    aligned = [end_id, *(i for i in eos_ids if i != end_id)]
    pad_id = tokenizer.pad_token_id if generation_config.pad_token_id is None else generation_config.pad_token_id
    generation_changed = (aligned, pad_id) != (generation_config.eos_token_id, generation_config.pad_token_id)
    generation_config.eos_token_id, generation_config.pad_token_id = aligned, pad_id
    return EosAlignment(tokenizer_changed, generation_changed)


def local_model_dir(path: str) -> str:
    """``path`` when it exists locally, else the folder of its hub snapshot (downloaded if not cached)."""
    if Path(path).exists():
        return path
    from huggingface_hub import snapshot_download

    return snapshot_download(path)


def load_tokenizer(path: str | Path, *, gguf_file: str = "") -> Any:
    """``AutoTokenizer.from_pretrained(path[, gguf_file])`` with eos = the chat end-of-turn token and a pad token
    (the eos when the tokenizer defines none)."""
    from transformers import AutoTokenizer

    extra = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    where = Path(path) / gguf_file if gguf_file else path
    if not tokenizer.chat_template:
        raise ChatTemplateError(f"tokenizer at {where} has no chat template; SFT formatting and evaluation need one")
    tokenizer.eos_token = end_of_turn_token(tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str | Path, *, gguf_file: str = "", attn_implementation: str | None = None,
                   dtype: Any = "float32") -> Any:
    """``AutoModelForCausalLM.from_pretrained(path[, gguf_file], dtype, attn_implementation)``.

    ``dtype`` is a ``torch.dtype``, its name (``"bfloat16"``) or ``"auto"`` (the checkpoint's); a GGUF file is
    dequantised to it. ``attn_implementation=None`` keeps transformers' default.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    extra: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    if attn_implementation is not None:
        extra["attn_implementation"] = attn_implementation
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra)


def current_umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``; elsewhere set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | Path) -> None:
    """Gives ``path`` (a safetensors file, or every one in a folder) the mode the umask gives any new file:
    safetensors creates its files 0600 whatever the umask, so on a shared run root nobody else could read them."""
    path = Path(path)
    mode = 0o666 & ~current_umask()
    for weights in [path] if path.is_file() else path.rglob("*.safetensors"):
        os.chmod(weights, mode)
