"""A token loss's one calibration before training (``TokenLoss.calibration``), on rank 0's full initial model.

The trainer calls :func:`calibrate_token_loss` on the base model before sharding it (rank 0 holds the only full copy
then), broadcasts the constants and hands them to every rank's ``TokenLoss.load_calibration``; a resumed run does
the same again on the base model, so the constants are always those of the initial model. The statistic comes from
``sft.token_stats.position_statistics`` (chunked); the trainer never learns which method asked.
"""
from __future__ import annotations

from typing import Sequence

import torch
from transformers import PreTrainedModel

from sft.losses import TokenLoss
from sft.policy import final_hidden_states
from sft.token_stats import position_statistics


def calibrate_token_loss(token_loss: TokenLoss, model: PreTrainedModel, sequences: Sequence[Sequence[int]],
                         chunk_size: int, device: torch.device) -> dict[str, float] | None:
    """``token_loss.calibrate`` of its statistic at every position of the first ``num_sequences`` of ``sequences``
    (token ids, one forward each, on ``device``; the model goes back where it was), or None when the loss asks for
    no calibration."""
    request = token_loss.calibration()
    if request is None:
        return None
    chosen = sequences[:request.num_sequences]
    if not chosen:
        raise ValueError(f"{token_loss.name}: no sequences to calibrate on")
    home = next(model.parameters()).device
    model.to(device)
    values = []
    try:
        with torch.no_grad():
            for ids in chosen:
                hidden = final_hidden_states(model, torch.tensor([list(ids)], device=device), None)[0]
                values.append(position_statistics(hidden, model.get_output_embeddings().weight, (request.stat,),
                                                  chunk_size=chunk_size, **request.term_options)[request.stat])
    finally:
        model.to(home)
    constants = token_loss.calibrate(torch.cat(values).cpu())
    return {**constants, "sequences": float(len(chosen))}
