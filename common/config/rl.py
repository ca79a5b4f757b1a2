"""Schema of the RL stage: what we decide for DAPO, plus a pass-through of verl keys.

``rl/verl_args.py`` turns these fields into ``python -m verl.trainer.main_ppo`` overrides; anything verl has
that we do not decide goes through ``verl_overrides`` unchanged (and wins over ours).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from common.config.common import SUPERVISION, ConfigError, SamplingConfig, check_choice, check_range

REWARD_STYLES = {"plus_minus_one": (1.0, -1.0), "zero_one": (1.0, 0.0)}
"""Reward style -> (score of a correct answer, score of a wrong one)."""


@dataclass
class RLConfig(SamplingConfig):
    """DAPO with verl 0.9.1 (``python -m verl.trainer.main_ppo``); the rollouts sample with ``temperature`` and
    ``top_p`` (:class:`SamplingConfig`)."""

    init: str = ""
    """Variant RL starts from, which names its run folder: ``base`` (the base model) or an SFT method label; empty =
    the label of ``sft.method``."""
    init_run: str = ""
    """The SFT run folder RL starts from, which the orchestrator's plan hands down; empty: the configured method's run
    (``sft.method``), or the base model for ``init=base``."""
    lr: float = 1e-6
    """Actor learning rate (AdamW)."""
    lr_warmup_steps: int = 10
    """Linear warm-up steps of the learning rate (then constant)."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip of the actor."""
    train_batch_size: int = 256
    """Prompts per RL step (after group filtering)."""
    ppo_mini_batch_size: int = 32
    """Prompts per actor update: train_batch_size / ppo_mini_batch_size optimiser steps per RL step."""
    ppo_epochs: int = 1
    """Passes over each RL batch."""
    rollout_n: int = 16
    """Rollouts per prompt (the GRPO group size G)."""
    total_steps: int = 200
    """RL steps."""
    max_prompt_length: int = 2048
    """Prompt tokens (longer prompts are filtered out)."""
    max_response_length: int = 8192
    """Response tokens L_max."""
    clip_ratio_low: float = 0.2
    """ε_low: the ratio r = π_θ/π_old is clipped below at 1 - ε_low."""
    clip_ratio_high: float = 0.28
    """ε_high (clip-higher): r is clipped above at 1 + ε_high."""
    clip_ratio_c: float = 10.0
    """Dual-clip bound for negative advantages: the per-token loss is capped at -c·Â (must be > 1)."""
    loss_agg_mode: str = "token-mean"
    """Loss aggregation: token-mean (DAPO: one denominator for all tokens of the mini-batch) or a seq-mean variant."""
    val_temperature: float = 1.0
    """Validation sampling temperature (verl's in-training validation; the eval stage has its own)."""
    val_top_p: float = 0.7
    """Validation nucleus mass (DAPO recipe)."""
    val_n: int = 1
    """Validation samples per prompt."""
    filter_groups: bool = True
    """Dynamic sampling: drop groups whose ``filter_groups_metric`` is the same for all G rollouts, refill."""
    filter_groups_metric: str = "acc"
    """Per-rollout value the filter compares: acc (verified correct, from rl/reward.py) or reward (shaped score)."""
    max_inflight_gen_batches: int = 3
    """Prompt batches (in train_batch_size units) generated concurrently while refilling filtered groups."""
    max_gen_batches: int = field(default=100, metadata=SUPERVISION)
    """With ``filter_groups``: stop the run, naming the shares of all-right and all-wrong groups, when a step has
    judged this many generation batches (``train_batch_size`` prompt groups each) without ``train_batch_size`` mixed
    groups; 0: never. A step needs about 1 / (share of mixed groups) of them."""
    overlong_buffer: bool = True
    """Overlong reward shaping: penalty min(-(|o| - (L_max - L_buf)) / L_buf · factor, 0)."""
    overlong_buffer_len: int = 4096
    """L_buf in tokens (must be ≤ max_response_length)."""
    overlong_penalty_factor: float = 1.0
    """Penalty at |o| = L_max."""
    reward_style: str = "plus_minus_one"
    """Task reward: plus_minus_one (+1 correct / -1 wrong, the DAPO recipe) or zero_one."""
    use_dynamic_bsz: bool = True
    """Pack micro-batches by token count (max prompt + response tokens per GPU) instead of a fixed size."""
    micro_batch_size_per_gpu: int = 4
    """Sequences per forward/backward micro-batch when ``use_dynamic_bsz`` is false."""
    gradient_checkpointing: bool = True
    """Activation checkpointing of the actor."""
    rollout_tensor_parallel: int = 1
    """vLLM tensor-parallel size per rollout replica (GPU profile)."""
    gpu_memory_utilization: float = 0.6
    """Fraction of GPU memory vLLM may take (GPU profile)."""
    save_freq: int = field(default=20, metadata=SUPERVISION)
    """Save a verl checkpoint every N steps (and always at the last step, which is merged to HF)."""
    test_freq: int = 20
    """Run verl's validation on rl_val.parquet every N steps (0: never)."""
    val_before_train: bool = True
    """Validate once before the first step (a baseline for the curve)."""
    max_checkpoints_to_keep: int = field(default=2, metadata=SUPERVISION)
    """verl actor checkpoints kept on disk (older ones are deleted)."""
    stall_timeout_s: float = field(default=0.0, metadata=SUPERVISION)
    """Stop the run with an error when verl shows no progress for this long: no output line during start-up, no new
    step after the first; 0: never. verl 0.9.1 waits forever when one of its Ray actors dies (e.g. killed for
    memory)."""
    verl_overrides: dict[str, str] = field(default_factory=dict)
    """Extra verl keys passed through unchanged (``key: value``; prefix ``+`` for keys not in verl's schema); they win."""

    @property
    def kept_groups_per_step(self) -> int | None:
        """Prompt groups a DAPO step trains on when it filters groups (``train_batch_size``; dynamic sampling refills
        the ones it drops); None without group filtering."""
        return self.train_batch_size if self.filter_groups else None

    def validate(self) -> None:
        if "/" in self.init:
            raise ConfigError(f"rl.init must be 'base' or an SFT method label (a folder name); got {self.init!r}")
        if self.init == "base" and self.init_run:
            raise ConfigError(f"rl.init=base starts from the base model, but rl.init_run names an SFT run "
                              f"({self.init_run}); drop one")
        check_range("rl.lr", self.lr, 0.0, 1.0, low_open=True)
        check_range("rl.lr_warmup_steps", self.lr_warmup_steps, 0)
        check_range("rl.weight_decay", self.weight_decay, 0.0)
        check_range("rl.grad_clip", self.grad_clip, 0.0, low_open=True)
        check_range("rl.train_batch_size", self.train_batch_size, 1)
        check_range("rl.ppo_mini_batch_size", self.ppo_mini_batch_size, 1, self.train_batch_size)
        if self.train_batch_size % self.ppo_mini_batch_size:
            raise ConfigError(f"rl.ppo_mini_batch_size ({self.ppo_mini_batch_size}) must divide "
                              f"rl.train_batch_size ({self.train_batch_size})")
        check_range("rl.ppo_epochs", self.ppo_epochs, 1)
        check_range("rl.rollout_n", self.rollout_n, 1)
        check_range("rl.total_steps", self.total_steps, 1)
        check_range("rl.max_prompt_length", self.max_prompt_length, 1)
        check_range("rl.max_response_length", self.max_response_length, 1)
        check_range("rl.clip_ratio_low", self.clip_ratio_low, 0.0, 1.0)
        check_range("rl.clip_ratio_high", self.clip_ratio_high, 0.0)
        check_range("rl.clip_ratio_c", self.clip_ratio_c, 1.0, low_open=True)
        check_choice("rl.loss_agg_mode", self.loss_agg_mode,
                     ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
        self.validate_sampling("rl", greedy=False)
        check_range("rl.val_temperature", self.val_temperature, 0.0)
        check_range("rl.val_top_p", self.val_top_p, 0.0, 1.0, low_open=True)
        check_range("rl.val_n", self.val_n, 1)
        check_choice("rl.filter_groups_metric", self.filter_groups_metric, ("acc", "reward"))
        if self.filter_groups and self.rollout_n < 2:
            raise ConfigError("rl.filter_groups needs rl.rollout_n >= 2 (a group of one is always uniform)")
        check_range("rl.max_inflight_gen_batches", self.max_inflight_gen_batches, 1)
        check_range("rl.max_gen_batches", self.max_gen_batches, 0)
        if self.overlong_buffer:
            check_range("rl.overlong_buffer_len", self.overlong_buffer_len, 1, self.max_response_length)
        check_range("rl.overlong_penalty_factor", self.overlong_penalty_factor, 0.0)
        check_choice("rl.reward_style", self.reward_style, tuple(REWARD_STYLES))
        check_range("rl.micro_batch_size_per_gpu", self.micro_batch_size_per_gpu, 1)
        if not self.use_dynamic_bsz and (self.ppo_mini_batch_size * self.rollout_n) % self.micro_batch_size_per_gpu:
            # verl asserts this deep inside its first log-prob pass, after Ray and vLLM have started.
            raise ConfigError(f"rl.micro_batch_size_per_gpu ({self.micro_batch_size_per_gpu}) must divide "
                              f"rl.ppo_mini_batch_size x rl.rollout_n ({self.ppo_mini_batch_size} x {self.rollout_n}) "
                              "when rl.use_dynamic_bsz is false")
        check_range("rl.rollout_tensor_parallel", self.rollout_tensor_parallel, 1)
        check_range("rl.gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, low_open=True)
        check_range("rl.save_freq", self.save_freq, 1)
        check_range("rl.test_freq", self.test_freq, 0)
        check_range("rl.max_checkpoints_to_keep", self.max_checkpoints_to_keep, 1)
        check_range("rl.stall_timeout_s", self.stall_timeout_s, 0.0)
        for key in self.verl_overrides:
            if not key or "=" in key or " " in key:
                raise ConfigError(f"rl.verl_overrides has an invalid verl key {key!r} (write key: value)")
