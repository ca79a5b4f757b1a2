"""The deterministic SFT / RL / RL-validation split, by problem, independent of the training seed.

Rows are grouped by :func:`data.schema.problem_key` (duplicates of one problem form one group) and the groups are
ordered by sha256(f"{split_seed}:{key}"). Walking that order, a group joins SFT while it still fits in
``num_sft_rows``; every other group goes to RL, except that the first groups after SFT's last one (taken whole, until
``num_heldout_rows`` rows) form the held-out SFT slice: rows SFT never trains on, drawn from the same order, for the
held-out NLL (docs/evaluation.md). The last ``num_rl_val_rows`` rows' groups of the RL order (taken
whole) form the RL validation set, the rest is the RL training set (capped at ``num_rl_rows``). So a problem never
straddles two parts, and the same seed always gives the same split.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass

from common.errors import ConfigError
from data.schema import problem_key


@dataclass
class Split:
    """Row positions (into the loaded rows) of each part, in split order."""

    sft: list[int]
    heldout: list[int]
    """The held-out SFT slice (empty when ``num_heldout_rows`` is 0)."""
    rl: list[int]
    rl_val: list[int]
    num_rl_capped: int
    """RL rows dropped by the ``num_rl_rows`` cap (recorded in the manifest)."""


def _order_key(split_seed: int, key: str) -> str:
    return hashlib.sha256(f"{split_seed}:{key}".encode()).hexdigest()


def split_rows(problems: list[str], *, num_sft_rows: int, num_rl_rows: int, num_rl_val_rows: int,
               split_seed: int, num_heldout_rows: int = 0) -> Split:
    """Splits rows given their problem texts (see the module doc); ``num_rl_rows=-1`` keeps every RL row."""
    groups: dict[str, list[int]] = defaultdict(list)
    for position, text in enumerate(problems):
        groups[problem_key(text)].append(position)
    ordered = sorted(groups, key=lambda key: _order_key(split_seed, key))
    if len(problems) <= num_sft_rows:
        raise ConfigError(f"data.num_sft_rows={num_sft_rows} leaves no RL rows: the training set has only "
                          f"{len(problems)} valid rows; fix: set data.num_sft_rows below {len(problems)}")
    sft: list[int] = []
    rest: list[list[int]] = []
    for key in ordered:
        members = groups[key]
        if len(sft) + len(members) <= num_sft_rows:
            sft.extend(members)
        else:
            rest.append(members)
    heldout: list[int] = []
    while rest and len(heldout) < num_heldout_rows:
        heldout.extend(rest.pop(0))
    rl_val: list[int] = []
    while rest and len(rl_val) < num_rl_val_rows:
        rl_val.extend(rest.pop())
    rl = [position for members in rest for position in members]
    if not rl:
        raise ConfigError(f"no RL training rows left after {len(sft)} SFT, {len(heldout)} held-out and {len(rl_val)} "
                         "RL-validation rows; lower data.num_sft_rows, data.num_heldout_rows or data.num_rl_val_rows")
    capped = 0
    if num_rl_rows != -1 and len(rl) > num_rl_rows:
        capped = len(rl) - num_rl_rows
        rl = rl[:num_rl_rows]
    return Split(sft=sft, heldout=heldout, rl=rl, rl_val=rl_val, num_rl_capped=capped)


def ids_digest(ids: list[int]) -> str:
    """sha256 of the sorted id list (``"1,5,9"``): one line in the manifest that pins a split part."""
    return hashlib.sha256(",".join(str(i) for i in sorted(ids)).encode()).hexdigest()
