"""Schema of the RL stage: what we decide for DAPO, plus a pass-through of verl keys."""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.config.common import check_range


@dataclass
class RLConfig:
    """DAPO with verl 0.9.1 (``python -m verl.trainer.main_ppo``)."""

    lr: float = 1e-6
    """Actor learning rate."""
    train_batch_size: int = 256
    """Prompts per RL step."""
    ppo_mini_batch_size: int = 32
    """Prompts per actor update (mini-batch)."""
    rollout_n: int = 16
    """Rollouts per prompt."""
    total_steps: int = 200
    """RL steps."""
    max_prompt_length: int = 2048
    """Prompt tokens (longer prompts are filtered)."""
    max_response_length: int = 8192
    """Response tokens."""
    verl_overrides: dict[str, str] = field(default_factory=dict)
    """Extra verl keys passed through unchanged (``key: value``; prefix ``+`` for keys not in verl's schema)."""

    def validate(self) -> None:
        check_range("rl.lr", self.lr, 0.0, 1.0, low_open=True)
        check_range("rl.train_batch_size", self.train_batch_size, 1)
        check_range("rl.ppo_mini_batch_size", self.ppo_mini_batch_size, 1, self.train_batch_size)
        check_range("rl.rollout_n", self.rollout_n, 1)
        check_range("rl.total_steps", self.total_steps, 1)
        check_range("rl.max_prompt_length", self.max_prompt_length, 1)
        check_range("rl.max_response_length", self.max_response_length, 1)
