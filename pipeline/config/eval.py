"""Schema of the evaluation stage: vLLM sampling parameters and metrics."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.common import check_range


@dataclass
class EvalConfig:
    """Sampling with vLLM and scoring with math-verify."""

    n: int = 32
    """Samples per problem (avg@n; pass@k for every k ≤ n)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_tokens: int = 8192
    """Response tokens per sample."""

    def validate(self) -> None:
        check_range("eval.n", self.n, 1)
        check_range("eval.temperature", self.temperature, 0.0)
        check_range("eval.top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_range("eval.max_tokens", self.max_tokens, 1)
