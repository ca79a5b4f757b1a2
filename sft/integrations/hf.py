"""A registered token loss as the plain HF ``Trainer``'s ``compute_loss_func`` (reference-free losses only).

The ``Trainer`` hands the function the model's full logits, and with ``compute_loss_func`` set it neither divides by
the gradient-accumulation steps nor averages over ranks itself (it multiplies by the world size, DDP averages), so
the function returns each micro-batch's share of the step's token mean: ``L_m · n_m / N`` with ``n_m`` the micro-batch's
supervised tokens and ``N = num_items_in_batch`` those of the whole step on every rank (docs/trl.md).
"""
from __future__ import annotations

from typing import Any, Callable

from torch import Tensor

from common.config.common import ConfigError
from common.config.sft import SFTMethod
from sft.losses import build_loss, method_config
from sft.token_stats import dense_loss


def token_loss_func(token_loss: str | SFTMethod, **options: Any) -> Callable[..., Tensor]:
    """``Trainer(compute_loss_func=token_loss_func("dft"))``: ``token_loss`` (a registered name or its config,
    ``options`` overriding its fields) on the full logits; losses needing a reference or an old policy are refused
    (use :class:`sft.integrations.trl.TokenLossSFTTrainer`)."""
    loss = build_loss(method_config(token_loss, **options))
    if loss.needs_reference or loss.needs_old_policy:
        frozen = "a frozen reference" if loss.needs_reference else "an old policy"
        raise ConfigError(f"token loss {loss.name!r} needs {frozen}, which Trainer's compute_loss_func cannot see: "
                          "use sft.integrations.trl.TokenLossSFTTrainer")
    if loss.calibration() is not None:
        raise ConfigError(f"token loss {loss.name!r} calibrates before training, which compute_loss_func cannot: "
                          "set sft.method.threshold_calibration=none")

    def compute_loss_func(outputs: Any, labels: Tensor, num_items_in_batch: Tensor | int | None = None) -> Tensor:
        result = dense_loss(loss, outputs.logits, labels)
        if num_items_in_batch is None:
            return result.loss
        return result.loss * result.num_tokens / num_items_in_batch

    return compute_loss_func
