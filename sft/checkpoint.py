"""Resumable SFT checkpoints: :class:`Checkpointer` is the only code that writes, reads or deletes them.

Layout in the run folder (``common.paths.sft_dir``)::

    checkpoints/step_<N>/    DCP shards (policy, or its LoRA adapters; optimiser; old policy) + rank<r>.pt (RNG,
                             scheduler)
                             + trainer_state.json (written last: the checkpoint's completion marker, with the
                               sha256 of every other file of the folder under "files")

A checkpoint counts once its ``trainer_state.json`` exists; the newest ``sft.keep_checkpoints`` complete ones stay.
A resume trusts a checkpoint only when its files still have the recorded digests: a damaged one (a truncated or
overwritten shard) is named, moved aside to ``damaged_step_<N>`` and the one before it is tried, down to step 0.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from common.manifest import sha256_file
from sft.data import DataOrder
from sft.distributed import DistEnv
from sft.lora import is_adapter_key, is_lora
from sft.policy import PolicyWithTokenLoss

CHECKPOINTS_DIR = "checkpoints"
TRAINER_STATE_FILE = "trainer_state.json"
FILE_DIGESTS_KEY = "files"
"""The key of ``trainer_state.json`` holding ``{relative path: sha256}`` of the checkpoint's other files."""


class ResumeError(RuntimeError):
    """A checkpoint cannot continue this run (different world size or schedule, unreadable state); the message
    says why and names the file."""


@dataclass(frozen=True)
class TrainerState:
    """Where training stands after ``global_step`` optimiser steps; saved as ``trainer_state.json``."""

    global_step: int
    total_steps: int
    epoch: int
    """Epoch of the next step's rows (``DataOrder.position``)."""
    index_in_epoch: int
    """Position of the next step's first row in that epoch's order."""
    world_size: int
    supervised_tokens: int = 0
    """Summed over every optimiser step so far (all ranks); likewise ``input_tokens`` and ``train_time_s``."""
    input_tokens: int = 0
    train_time_s: float = 0.0
    """Optimiser-step time summed over every launch (checkpointing and refreshes excluded)."""
    last_loss: float = math.nan

    @classmethod
    def start(cls, total_steps: int, world_size: int) -> "TrainerState":
        return cls(global_step=0, total_steps=total_steps, epoch=0, index_in_epoch=0, world_size=world_size)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def read(cls, path: Path) -> "TrainerState":
        """The state in ``path``; :class:`ResumeError` naming the file if it is not one."""
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ResumeError(f"{path} is not a readable trainer state ({error}); delete the checkpoints to restart")
        names = {f.name for f in dataclasses.fields(cls)}
        if isinstance(record, dict):
            record.pop(FILE_DIGESTS_KEY, None)
        if not isinstance(record, dict) or record.keys() != names:
            found = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ResumeError(f"{path} holds {found}, a trainer state has {sorted(names)}; it was written by "
                              "another version of the trainer: delete the checkpoints to restart")
        return cls(**record)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    """Saves, finds, restores and prunes the DCP checkpoints in ``<run>/checkpoints/step_<N>``."""

    def __init__(self, run_dir: Path, *, keep: int, env: DistEnv):
        self.root = run_dir / CHECKPOINTS_DIR
        self.keep = keep
        self.env = env

    def path(self, step: int) -> Path:
        return self.root / f"step_{step:06d}"

    def complete_steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(p.name.removeprefix("step_")) for p in self.root.glob("step_*")
                      if (p / TRAINER_STATE_FILE).is_file())

    def clear(self) -> None:
        """Collective: removes every checkpoint (a fresh start must never resume a stale run's weights)."""
        if self.env.is_main and self.root.exists():
            shutil.rmtree(self.root)
        dist.barrier()

    @staticmethod
    def _sharded_state(root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """What a checkpoint holds: the policy (with LoRA its adapters only, the old one included: the base never
        changes), the optimiser and a separate old policy."""
        policy = get_model_state_dict(root.policy)
        if is_lora(root.policy):
            policy = {name: tensor for name, tensor in policy.items() if is_adapter_key(name)}
        state = {"policy": policy, "optimizer": get_optimizer_state_dict(root.policy, optimizer)}
        if isinstance(root.old_policy, nn.Module):
            state["old_policy"] = get_model_state_dict(root.old_policy)
        return state

    def save(self, state: TrainerState, root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer,
             scheduler: torch.optim.lr_scheduler.LRScheduler) -> Path:
        """Collective: the checkpoint of ``state.global_step``, then the oldest complete ones beyond ``keep`` go."""
        path = self.path(state.global_step)
        if self.env.is_main and path.exists():
            shutil.rmtree(path)  # a partial folder left by a crash during an earlier save
        dist.barrier()
        dcp.save(self._sharded_state(root, optimizer), checkpoint_id=str(path))
        torch.save({"rng": rng_state(), "scheduler": scheduler.state_dict()}, path / f"rank{self.env.rank}.pt")
        dist.barrier()
        names = [sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())]
        dist.broadcast_object_list(names, src=0)  # every rank hashes its share of the list rank 0 sees
        digests = self._digests(path, names[0])
        if self.env.is_main:
            tmp = path / f".{TRAINER_STATE_FILE}.tmp"
            tmp.write_text(json.dumps({**dataclasses.asdict(state), FILE_DIGESTS_KEY: digests}, indent=2,
                                      sort_keys=True))
            os.replace(tmp, path / TRAINER_STATE_FILE)
            for old in self.complete_steps()[:-self.keep]:
                shutil.rmtree(self.path(old))
        dist.barrier()
        return path

    def _digests(self, path: Path, names: list[str]) -> dict[str, str]:
        """Collective: the sha256 of each named file of ``path`` (the files shared out among the ranks); a file that
        cannot be read gets the reason instead."""
        mine = {}
        for name in names[self.env.rank::self.env.world_size]:
            try:
                mine[name] = sha256_file(path / name)
            except OSError as error:
                mine[name] = f"unreadable ({error.strerror})"
        gathered: list[dict[str, str]] = [{} for _ in range(self.env.world_size)]
        dist.all_gather_object(gathered, mine)
        return {name: digest for part in gathered for name, digest in part.items()}

    def damage(self, path: Path) -> str | None:
        """Collective: the first file of checkpoint ``path`` that no longer has the sha256 recorded when it was
        written (a truncated or overwritten shard), as one sentence; None when all match, or when the checkpoint
        predates the digests (a state file of another kind is :meth:`load`'s to refuse)."""
        state_file = path / TRAINER_STATE_FILE
        try:
            record = json.loads(state_file.read_text())
        except (OSError, ValueError) as error:
            return f"{state_file} is not readable ({error})"
        recorded = record.get(FILE_DIGESTS_KEY) if isinstance(record, dict) else None
        if recorded is None:
            return None
        found = self._digests(path, sorted(recorded))
        for name, digest in sorted(recorded.items()):
            if found[name] != digest:
                now = found[name] if found[name].startswith("unreadable") else (
                    f"{(path / name).stat().st_size} bytes, sha256 {found[name][:12]}")
                return f"{path / name} is not the file written at that step ({now}, recorded {digest[:12]})"
        return None

    def newest_intact(self, announce: Callable[[str], None]) -> Path | None:
        """Collective: the newest complete checkpoint whose files match their digests; each damaged one before it is
        named with the step it falls back to, and moved aside to ``damaged_step_<N>``."""
        steps = self.complete_steps()
        while steps:
            step = steps.pop()
            problem = self.damage(self.path(step))
            if problem is None:
                return self.path(step)
            fallback = f"the checkpoint of step {steps[-1]}" if steps else "step 0"
            announce(f"[sft] checkpoint of step {step} is DAMAGED: {problem}; moved to damaged_{self.path(step).name}"
                     f", falling back to {fallback}")
            if self.env.is_main:
                aside = self.root / f"damaged_{self.path(step).name}"
                shutil.rmtree(aside, ignore_errors=True)
                os.replace(self.path(step), aside)
            dist.barrier()
        return None

    def load(self, path: Path, root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer,
             scheduler: torch.optim.lr_scheduler.LRScheduler, *, total_steps: int) -> TrainerState:
        """Collective: restores everything saved in ``path`` and returns its trainer state (raises
        :class:`ResumeError` first if the checkpoint belongs to another world size or schedule)."""
        state = TrainerState.read(path / TRAINER_STATE_FILE)
        if state.world_size != self.env.world_size:
            raise ResumeError(f"{path} was written by {state.world_size} ranks, this run has "
                              f"{self.env.world_size}: the global batch (and data order) would change; relaunch "
                              "with the original number of processes or delete the checkpoints to restart")
        if state.total_steps != total_steps:
            raise ResumeError(f"{path} planned {state.total_steps} optimiser steps, this run plans "
                              f"{total_steps}; delete the checkpoints to restart")
        sharded = self._sharded_state(root, optimizer)
        dcp.load(sharded, checkpoint_id=str(path))
        set_model_state_dict(root.policy, sharded["policy"], options=StateDictOptions(strict=not is_lora(root.policy)))
        set_optimizer_state_dict(root.policy, optimizer, sharded["optimizer"])
        if isinstance(root.old_policy, nn.Module):
            set_model_state_dict(root.old_policy, sharded["old_policy"])
        rank_state = torch.load(path / f"rank{self.env.rank}.pt", weights_only=False)
        scheduler.load_state_dict(rank_state["scheduler"])
        set_rng_state(rank_state["rng"])
        return state

    def restore_or_start(self, root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer,
                         scheduler: torch.optim.lr_scheduler.LRScheduler, *, order: DataOrder, total_steps: int,
                         resume: bool, announce: Callable[[str], None] = print) -> TrainerState:
        """Collective: the state to train from, the newest intact checkpoint's when ``resume``, else step 0 (and a
        fresh start deletes every checkpoint, so a stale run's weights can never be picked up later)."""
        latest = self.newest_intact(announce) if resume else None
        if latest is None:
            if resume:
                announce(f"[sft] no intact checkpoint in {self.root}; starting from step 0")
            else:
                self.clear()
            return TrainerState.start(total_steps, self.env.world_size)
        state = self.load(latest, root, optimizer, scheduler, total_steps=total_steps)
        epoch, index = order.position(state.global_step)
        announce(f"[sft] RESUMING from {latest} after optimiser step {state.global_step}/{total_steps}: "
                 f"epoch {epoch}, row {index} of that epoch's order")
        return state
