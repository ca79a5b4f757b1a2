"""Hand-back: verl's final FSDP actor checkpoint -> an HF folder the evaluation stage loads unchanged.

``python -m verl.model_merger merge --backend fsdp`` writes the weights (verl merges to bfloat16 whatever the
training dtype) with the config and tokenizer verl saved next to the checkpoint; a LoRA actor
(``rl.init_lora=adapter``) it writes as the base plus ``lora_adapter/``, which :func:`merge_lora_adapter` merges.
:func:`check_hf_export` then loads it with transformers and aligns its eos as the SFT export does
(``common.models.align_eos``), so vLLM generation from the RL model ends where the SFT model's did.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.models import align_eos, follow_umask, load_causal_lm

VERL_LORA_ADAPTER = "lora_adapter"
"""Where verl's model merger leaves a LoRA actor's adapter: inside the HF folder of the base, unmerged."""
LATEST_ITERATION_FILE = "latest_checkpointed_iteration.txt"
"""verl's marker of the newest complete checkpoint in ``trainer.default_local_dir``."""


def latest_checkpoint_step(checkpoint_dir: Path) -> int:
    """The step of verl's newest complete checkpoint in ``checkpoint_dir`` (0 when there is none)."""
    marker = checkpoint_dir / LATEST_ITERATION_FILE
    if not marker.exists():
        return 0
    text = marker.read_text().strip()
    if not text.isdigit():
        raise RuntimeError(f"{marker} holds {text!r}, not a step number; delete it to restart from the last "
                           "global_step_* folder")
    return int(text)


def merge_command(actor_dir: Path, target_dir: Path) -> list[str]:
    return [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
            "--local_dir", str(actor_dir), "--target_dir", str(target_dir)]


def merge_actor(checkpoint_dir: Path, step: int, target_dir: Path, env: dict[str, str], log_path: Path) -> None:
    """Merges ``global_step_<step>/actor`` into ``target_dir`` (log appended to ``log_path``)."""
    actor_dir = checkpoint_dir / f"global_step_{step}" / "actor"
    if not actor_dir.is_dir():
        raise RuntimeError(f"verl reported step {step} as saved but {actor_dir} does not exist")
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(merge_command(actor_dir, target_dir))}\n")
        log.flush()
        result = subprocess.run(merge_command(actor_dir, target_dir), env=env, stdout=log,
                                stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"verl's model merger failed (exit {result.returncode}); see {log_path}")


def merge_lora_adapter(hf_dir: Path, adapter_dir: Path) -> bool:
    """Merges the adapter verl's merger left in ``hf_dir/lora_adapter/`` into ``hf_dir``'s weights, W + (α/r)·BA
    (peft's ``merge_and_unload``, in the folder's dtype), and moves the adapter to ``adapter_dir``; False (nothing
    changed) when ``hf_dir`` holds no adapter."""
    from peft import PeftModel

    source = hf_dir / VERL_LORA_ADAPTER
    if not source.is_dir():
        return False
    merged = PeftModel.from_pretrained(load_causal_lm(hf_dir, dtype="auto"), source).merge_and_unload()
    for weights in hf_dir.glob("model*.safetensors*"):  # unlinked, not overwritten: the loaded tensors may map them
        weights.unlink()
    merged.save_pretrained(hf_dir)
    shutil.rmtree(adapter_dir, ignore_errors=True)  # an earlier attempt's
    shutil.move(source, adapter_dir)
    follow_umask(adapter_dir)
    return True


def check_hf_export(hf_dir: Path) -> dict[str, Any]:
    """Loads ``hf_dir`` with transformers, aligns its eos (:func:`common.models.align_eos`, saving what changed);
    returns facts."""
    from transformers import AutoTokenizer, GenerationConfig

    follow_umask(hf_dir)  # verl's merger writes the weights with safetensors
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    try:
        generation = GenerationConfig.from_pretrained(hf_dir)
    except OSError:
        generation = GenerationConfig()
    fixed = align_eos(tokenizer, generation)
    if fixed.tokenizer:
        tokenizer.save_pretrained(hf_dir)
    if fixed.generation_config:
        generation.save_pretrained(hf_dir)
    model = load_causal_lm(hf_dir, dtype="auto")
    return {"dtype": str(model.dtype).removeprefix("torch."), "num_parameters": model.num_parameters(),
            "end_of_turn_token": tokenizer.eos_token, "eos_token_id": tokenizer.eos_token_id,
            "fixed_generation_config": fixed.generation_config}
