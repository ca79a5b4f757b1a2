"""The tokenised SFT split and the trainer's deterministic micro-batches.

Input contract (written by the data stage): ``common.paths.sft_tokens_path(cfg)`` with columns
``input_ids`` (list[int]), ``labels`` (list[int], HF convention: unshifted, ``-100`` on prompt tokens,
``labels[i] == input_ids[i]`` elsewhere), ``row_id``, ``num_response_tokens``, ``truncated``; optionally
``behaviour_logp`` (list[float], one per token: log π_β of the token under the policy that generated the row, NaN
on the prompt), which :func:`collate` hands to a loss that reads it (PEAR).

Batching contract (what makes 1-rank and N-rank runs train on the same micro-batches):

* epoch ``e`` visits the rows in ``randperm(num_rows)`` drawn from a generator seeded by
  ``derive_seed(order_seed, f"epoch{e}")``; the last ``num_rows mod global_batch`` rows of each epoch's order are
  not used (a different remainder every epoch);
* optimiser step ``s`` (counted over the whole run) takes the ``global_batch = micro_batch_size · grad_accum ·
  world_size`` rows at positions ``[j·global_batch, (j+1)·global_batch)`` of epoch ``s // steps_per_epoch``'s order,
  with ``j = s mod steps_per_epoch``; so the data position is a pure function of the step count;
* those rows are sorted by length (longest first, ties by position) and cut into micro-batches of
  ``micro_batch_size`` consecutive rows; micro-batch ``m`` goes to rank ``m mod world_size``; each micro-batch is
  right-padded only to its own longest row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch

from common.paths import BEHAVIOUR_LOGP_COLUMN, IGNORE_INDEX
from common.seeding import derive_seed

REQUIRED_COLUMNS = ("input_ids", "labels", "row_id", "num_response_tokens", "truncated")


class SFTDataError(ValueError):
    """The tokenised SFT file breaks its contract; the message names the file, row and column."""


@dataclass(frozen=True)
class TokenisedRow:
    """One training sequence: token ids and unshifted labels of equal length."""

    row_id: str
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    behaviour_logp: tuple[float, ...] | None = None
    """Per token, its log-probability under the policy that generated the row (NaN on the prompt); None when the
    tokens file has no :data:`common.paths.BEHAVIOUR_LOGP_COLUMN`."""


def read_sft_tokens(path: str | Path, require_behaviour: bool = False) -> list[TokenisedRow]:
    """Reads and checks every row of the tokenised SFT split (raises :class:`SFTDataError` naming the bad row);
    ``require_behaviour``: the loss reads :data:`common.paths.BEHAVIOUR_LOGP_COLUMN`, which must be there."""
    path = Path(path)
    if not path.is_file():
        raise SFTDataError(f"{path}: tokenised SFT split not found; run the data stage first")
    table = pq.read_table(path)
    if require_behaviour and BEHAVIOUR_LOGP_COLUMN not in table.column_names:
        raise SFTDataError(f"{path}: no column {BEHAVIOUR_LOGP_COLUMN}, which the loss reads (PEAR: the log-probs of "
                           f"the policy that generated the rows, from the rows' behaviour_logprobs); rows or tokens "
                           "written before the column existed: re-run the data stage (force=[data])")
    missing = [name for name in REQUIRED_COLUMNS if name not in table.column_names]
    if missing:
        raise SFTDataError(f"{path}: missing column(s) {missing}; has {table.column_names}")
    rows = []
    columns = table.select(["row_id", "input_ids", "labels"]).to_pydict()
    behaviour = table.column(BEHAVIOUR_LOGP_COLUMN).to_pylist() if BEHAVIOUR_LOGP_COLUMN in table.column_names \
        else [None] * table.num_rows
    for index, (row_id, input_ids, labels, logps) in enumerate(zip(columns["row_id"], columns["input_ids"],
                                                                    columns["labels"], behaviour)):
        where = f"{path}: row {index} (row_id {row_id!r})"
        if not input_ids:
            raise SFTDataError(f"{where}: input_ids is empty")
        if labels is None or len(labels) != len(input_ids):
            raise SFTDataError(f"{where}: labels has {0 if labels is None else len(labels)} entries, "
                               f"input_ids has {len(input_ids)}")
        mismatch = next((i for i, (tok, lab) in enumerate(zip(input_ids, labels))
                         if lab != IGNORE_INDEX and lab != tok), None)
        if mismatch is not None:
            raise SFTDataError(f"{where}: labels[{mismatch}] = {labels[mismatch]} is neither {IGNORE_INDEX} nor "
                               f"input_ids[{mismatch}] = {input_ids[mismatch]} (labels must be unshifted)")
        if not any(lab != IGNORE_INDEX for lab in labels[1:]):
            raise SFTDataError(f"{where}: no supervised token after the first position (all labels are "
                               f"{IGNORE_INDEX}); the data stage should have dropped or fixed this row")
        if logps is not None and len(logps) != len(input_ids):
            raise SFTDataError(f"{where}: {BEHAVIOUR_LOGP_COLUMN} has {len(logps)} entries, input_ids has "
                               f"{len(input_ids)}")
        rows.append(TokenisedRow(str(row_id), tuple(input_ids), tuple(labels),
                                 None if logps is None else tuple(math.nan if v is None else v for v in logps)))
    if not rows:
        raise SFTDataError(f"{path}: no rows")
    return rows


def supervised_token_count(labels: torch.Tensor) -> int:
    """Number of supervised predictions: positions ``i`` whose target ``labels[i+1]`` is not ignored."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def collate(rows: list[TokenisedRow], pad_token_id: int) -> dict[str, torch.Tensor | None]:
    """Right-pads ``rows`` to their own longest length; ``attention_mask`` is None when nothing is padded;
    ``behaviour_logp`` [B, L] (NaN where padded) when every row has one."""
    length = max(len(row.input_ids) for row in rows)
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row.input_ids)
        input_ids[i, :n] = torch.tensor(row.input_ids)
        labels[i, :n] = torch.tensor(row.labels)
        attention_mask[i, :n] = 1
    padded = bool((attention_mask == 0).any())
    batch = {"input_ids": input_ids, "attention_mask": attention_mask if padded else None, "labels": labels}
    if all(row.behaviour_logp is not None for row in rows):  # NaN where padded
        batch["behaviour_logp"] = torch.full((len(rows), length), math.nan)
        for i, row in enumerate(rows):
            batch["behaviour_logp"][i, :len(row.behaviour_logp)] = torch.tensor(row.behaviour_logp)
    return batch


class DataOrder:
    """Which rows every rank trains on at every optimiser step (see the module docstring for the contract)."""

    def __init__(self, lengths: list[int], *, micro_batch_size: int, grad_accum: int, world_size: int,
                 order_seed: int):
        self.lengths = lengths
        self.micro_batch_size = micro_batch_size
        self.world_size = world_size
        self.order_seed = order_seed
        self.global_batch = micro_batch_size * grad_accum * world_size
        self._orders: dict[int, list[int]] = {}
        self.steps_per_epoch = len(lengths) // self.global_batch
        if self.steps_per_epoch == 0:
            raise SFTDataError(
                f"the SFT split has {len(lengths)} rows, fewer than one optimiser step's global batch of "
                f"{self.global_batch} (sft.micro_batch_size {micro_batch_size} x sft.grad_accum {grad_accum} "
                f"x {world_size} ranks); lower sft.micro_batch_size or sft.grad_accum")

    def epoch_order(self, epoch: int) -> list[int]:
        """The shuffled row order of ``epoch`` (a pure function of the order seed and the epoch)."""
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(derive_seed(self.order_seed, f"epoch{epoch}"))
            self._orders = {epoch: torch.randperm(len(self.lengths), generator=generator).tolist()}
        return self._orders[epoch]

    def position(self, step: int) -> tuple[int, int]:
        """``(epoch, rows of that epoch consumed before step)``: where optimiser step ``step`` starts."""
        epoch, step_in_epoch = divmod(step, self.steps_per_epoch)
        return epoch, step_in_epoch * self.global_batch

    def step_micro_batches(self, step: int) -> list[list[int]]:
        """All ``grad_accum · world_size`` micro-batches (row indices) of optimiser step ``step``, longest first."""
        epoch, start = self.position(step)
        rows = self.epoch_order(epoch)[start:start + self.global_batch]
        rows = sorted(rows, key=lambda row: -self.lengths[row])  # stable: ties keep their shuffled order
        return [rows[i:i + self.micro_batch_size] for i in range(0, len(rows), self.micro_batch_size)]

    def rank_micro_batches(self, step: int, rank: int) -> list[list[int]]:
        """The micro-batches rank ``rank`` runs at step ``step`` (every ``world_size``-th, starting at ``rank``)."""
        return self.step_micro_batches(step)[rank::self.world_size]
