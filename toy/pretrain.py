"""Pretraining of the toy base model: a tiny Qwen3 (head_dim 64) on packed toy-world documents.

Recipe (docs/toy_world.md): AdamW (β = 0.9, 0.95, weight decay 0.1) in ``toy.pretrain_dtype`` (fp32, or bf16
autocast over fp32 weights), linear warm-up over ``warmup_steps`` then cosine decay to 10% of the peak at the
*planned* last step, lr(s) = peak · s / warmup for s < warmup, else peak · (0.1 + 0.9 · ½(1 + cos(π · (s − warmup) / (steps − warmup)))).
The token stream is fixed by the seed, so batch ``s`` is the same whether or not the run was resumed.
"""
from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from common.answers import last_boxed
from toy.tokenizer import DOCUMENT_SEPARATOR, END_OF_TURN, PAD
from toy.arithmetic import SYSTEM_PROMPT, Problem, question

INTEGER = re.compile(r"-?\d+")
WARMUP_STEPS = 30
EVAL_MAX_NEW_TOKENS = 200
"""Response budget of the base model's health checks (greedy accuracy, entropy profile)."""
FINAL_LR_RATIO = 0.1


def build_model(tokenizer, *, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                intermediate_size: int, max_position_embeddings: int, seed: int):
    """A randomly initialised ``Qwen3ForCausalLM`` with head_dim 64 and tied embeddings."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=64,
        intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
        rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TURN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD))
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def pack_documents(tokenizer, docs: Iterable[str], num_sequences: int, seq_len: int,
                   batch_docs: int = 2048) -> torch.Tensor:
    """``[num_sequences, seq_len]`` token ids: documents joined by ``<|endoftext|>`` and cut into rows."""
    separator = tokenizer.convert_tokens_to_ids(DOCUMENT_SEPARATOR)
    needed = num_sequences * seq_len
    stream: list[int] = []
    docs = iter(docs)
    while len(stream) < needed:
        chunk = list(itertools.islice(docs, batch_docs))
        for ids in tokenizer(chunk, add_special_tokens=False)["input_ids"]:
            stream.extend(ids)
            stream.append(separator)
    return torch.tensor(stream[:needed], dtype=torch.long).view(num_sequences, seq_len)


def learning_rate(step: int, peak_lr: float, total_steps: int, warmup_steps: int = WARMUP_STEPS) -> float:
    """Linear warm-up then cosine to ``FINAL_LR_RATIO · peak`` at ``total_steps`` (formula in the module doc)."""
    warmup_steps = min(warmup_steps, max(total_steps - 1, 1))
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return peak_lr * (FINAL_LR_RATIO + (1 - FINAL_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


@dataclass
class TrainState:
    """What a checkpoint holds: the next step to run plus model and optimiser state."""

    step: int
    model: dict
    optimizer: dict


def save_checkpoint(path: Path, state: TrainState) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"step": state.step, "model": state.model, "optimizer": state.optimizer}, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path) -> TrainState | None:
    if not path.exists():
        return None
    data = torch.load(path, map_location="cpu", weights_only=True)
    return TrainState(data["step"], data["model"], data["optimizer"])


def train(model, sequences: torch.Tensor, *, steps: int, batch_size: int, peak_lr: float,
          checkpoint_path: Path, checkpoint_every: int, log: Callable[[int, dict], None],
          progress_bar, dtype: torch.dtype = torch.float32) -> dict:
    """Next-token pretraining on ``sequences`` (``steps * batch_size`` rows); resumes from ``checkpoint_path``."""
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    start = 0
    state = load_checkpoint(checkpoint_path)
    if state is not None:
        model.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        start = state.step
        progress_bar.update(start)
    model.train()
    last_loss = float("nan")
    for step in range(start, steps):
        lr = learning_rate(step, peak_lr, steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = sequences[step * batch_size:(step + 1) * batch_size].to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        last_loss = loss.item()
        log(step + 1, {"loss": last_loss, "lr": lr, "grad_norm": grad_norm.item()})
        progress_bar.update(1)
        progress_bar.set_postfix(loss=f"{last_loss:.3f}", refresh=False)
        if (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            save_checkpoint(checkpoint_path, TrainState(step + 1, model.state_dict(), optimizer.state_dict()))
    model.eval()
    return {"final_loss": last_loss, "steps": steps}


def boxed_integer(text: str) -> int | None:
    """The integer in the last complete ``\\boxed{...}`` of a completion (the evaluation's extractor,
    :func:`common.answers.last_boxed`, surrounding spaces stripped), or None when that box holds no integer."""
    answer = last_boxed(text)
    return int(answer) if answer is not None and INTEGER.fullmatch(answer.strip()) else None


@torch.no_grad()
def greedy_accuracy(model, tokenizer, problems: list[Problem], *, max_new_tokens: int, seed: int,
                    batch_size: int = 64) -> float:
    """Fraction of ``problems`` whose greedy completion boxes the right integer (a quick health check)."""
    rng = random.Random(seed)
    correct = 0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start:start + batch_size]
        prompts = [tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question(p, rng)}],
            add_generation_prompt=True, tokenize=False) for p in chunk]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        output = model.generate(**encoded.to(model.device), max_new_tokens=max_new_tokens, do_sample=False)
        texts = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
        correct += sum(boxed_integer(t) == p.answer for t, p in zip(texts, chunk))
    return correct / max(len(problems), 1)
