"""The policy's optimiser and learning-rate schedule, and how many optimiser steps a run plans."""
from __future__ import annotations

import math

import torch

from common.config import SFTConfig
from sft.policy import PolicyWithTokenLoss


def total_optimizer_steps(sft: SFTConfig, steps_per_epoch: int) -> int:
    """``steps_per_epoch · sft.epochs``, capped at ``sft.max_steps`` unless it is -1."""
    planned = steps_per_epoch * sft.epochs
    return planned if sft.max_steps == -1 else min(planned, sft.max_steps)


def num_warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    """``⌈warmup_ratio · total_steps⌉`` (HF's rounding)."""
    return math.ceil(warmup_ratio * total_steps)


def lr_multiplier(step: int, *, total_steps: int, warmup_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Factor on the peak learning rate for optimiser step ``step`` (0-based).

    Warm-up (``step < warmup_steps``): ``(step + 1) / (warmup_steps + 1)``, so the first update is not wasted at lr 0.
    Then ``constant``: 1; ``cosine``: ``min_lr_ratio + (1 − min_lr_ratio) · ½(1 + cos(π · (step − warmup_steps) /
    (total_steps − warmup_steps)))``, which starts at 1 and approaches ``min_lr_ratio`` at the last step.
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    progress_ratio = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress_ratio))


def build_optimizer(root: PolicyWithTokenLoss, sft: SFTConfig) -> torch.optim.AdamW:
    """AdamW on the policy; no weight decay on 1-D parameters (norm weights, biases), as HF Trainer does; fused with
    ``sft.adam_implementation=fused``."""
    params = [p for p in root.policy.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": sft.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=sft.lr, betas=tuple(sft.betas), eps=sft.adam_eps,
                             fused=True if sft.adam_implementation == "fused" else None)


def build_scheduler(optimizer: torch.optim.Optimizer, sft: SFTConfig,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-step ``LambdaLR`` with :func:`lr_multiplier` (``num_warmup_steps`` of ``sft.warmup_ratio``)."""
    warmup = num_warmup_steps(total_steps, sft.warmup_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(
        step, total_steps=total_steps, warmup_steps=warmup, schedule=sft.lr_schedule, min_lr_ratio=sft.min_lr_ratio))
