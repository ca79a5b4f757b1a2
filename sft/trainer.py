"""The SFT training loop: one loop for every token-loss method, resumable.

The trainer never branches on a method name, only on the capability flags of the loss built by
``sft.losses.build_loss``: ``needs_reference`` (a frozen copy of the base model, never refreshed) and
``needs_old_policy`` (a frozen copy of the policy, refreshed every ``old_policy_refresh_every`` optimiser steps);
with ``sft.lora`` both are views of the policy's own layers (:mod:`sft.lora`), and the loop is the same.
With ``sft.reference_cache`` the reference trunk never runs during training: its final hidden states are read per
micro-batch from ``sft.reference_cache`` and only the reference's LM head (``reference_head``) stays in the root.

Its parts, torchtitan style: :mod:`sft.distributed` (the process group), :mod:`sft.policy` (the FSDP2 root and its
sharding), :mod:`sft.optim` (optimiser, LR schedule), :mod:`sft.checkpoint` (:class:`~sft.checkpoint.Checkpointer`
and the typed :class:`~sft.checkpoint.TrainerState`); this module holds the step and the loop.

One optimiser step has three phases (torchtitan's ``train_step``): count the step's supervised tokens on every rank
(before any forward), forward/backward each micro-batch with its ``sft.loss_norm`` weight, then clip and step. The
step's objective and loss metrics stay on the device and cross ranks in one all-reduce per step. A loss that selects
over the whole optimiser step (``TokenLoss.selects_over_step``: EKSFT's Algorithm 1) first gets the statistics of
every micro-batch on every rank (:func:`select_over_step`); each micro-batch's forward/backward then uses its share.

Run folder (``common.paths.sft_dir``): ``checkpoints/`` (:mod:`sft.checkpoint`) and ``metrics.jsonl``, one line per
logged optimiser step.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from common.config import SFTConfig
from common.config.sft import LOSS_NORMS, STEP_PARTS_NORM
from common.paths import sft_stat_key
from common.tracking import MetricsLogger, progress
from sft.checkpoint import Checkpointer, TrainerState
from sft.data import DataOrder, TokenisedRow, collate, supervised_token_count
from sft.distributed import DistEnv, all_gather_blocks, max_over_ranks, peak_memory_gib
from sft.optim import total_optimizer_steps
from sft.policy import PolicyWithTokenLoss, autocast_context, refresh_old_policy
from sft.reference_cache import ReferenceCache
from sft.token_stats import TokenStats

SUPERSEDED_METRICS_FILE = "metrics.superseded.jsonl"


def micro_batch_weight(loss_norm: str, *, num_tokens: int, step_tokens: int, grad_accum: int,
                       world_size: int) -> float:
    """Weight ``w_m`` of micro-batch objective ``L_m`` in the step objective ``J = Σ_ranks Σ_m w_m · L_m``.

    * ``micro_batch_mean``: ``1 / (grad_accum · world_size)``, the mean of every micro-batch objective of the step
      (the paper's batch-level mean, D13 in docs/methods.md);
    * ``micro_batch_sum``: ``1 / world_size``, the sum over a rank's micro-batches and the mean over ranks (the
      official EKSFT code: HF Trainer does not divide by gradient accumulation, DeepSpeed averages ranks);
    * ``global_token_mean``: ``num_tokens / step_tokens``, each micro-batch weighted by its share of the step's
      supervised tokens over all ranks (counted before the forward, torchtitan style); for a token-mean loss
      such as plain SFT, ``J`` is the token mean over the whole step;
    * ``optimizer_batch_parts``: ``1``, each micro-batch objective is already its part of the step's one objective
      (a loss that selects over the whole step, :func:`select_over_step`), so ``J`` is their sum over micro-batches
      and ranks.
    """
    if loss_norm == "micro_batch_mean":
        return 1.0 / (grad_accum * world_size)
    if loss_norm == "micro_batch_sum":
        return 1.0 / world_size
    if loss_norm == "global_token_mean":
        return num_tokens / max(1, step_tokens)
    if loss_norm == STEP_PARTS_NORM:
        return 1.0
    raise ValueError(f"sft.loss_norm must be one of {list(LOSS_NORMS)}; got {loss_norm!r}")


# -------------------------------------------------------------------------------------------- one step
@dataclass
class StepResult:
    loss: float
    """The step objective ``J`` (see :func:`micro_batch_weight`)."""
    grad_norm: float
    supervised_tokens: int
    input_tokens: int
    metrics: dict[str, float]
    """Every entry of ``LossResult.metrics``, averaged over the step's micro-batches on all ranks."""


class StepMetrics:
    """The step objective ``J`` and the sums of every loss metric over this rank's micro-batches, kept on the device
    in float64; :meth:`reduce` sums them over ranks in one all-reduce (the step's only host sync for them)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.objective = torch.zeros((), dtype=torch.float64, device=device)
        self.names: tuple[str, ...] = ()
        self.sums = torch.zeros(0, dtype=torch.float64, device=device)
        self.micro_batches = 0

    def add(self, weight: float, loss: torch.Tensor, metrics: dict[str, torch.Tensor]) -> None:
        """Adds ``weight · loss`` to ``J`` and each metric to its sum."""
        self.objective += weight * loss.detach().double()
        if self.micro_batches == 0:
            self.names = tuple(metrics)
            self.sums = torch.zeros(len(self.names), dtype=torch.float64, device=self.device)
        elif set(metrics) != set(self.names):
            raise ValueError(f"a micro-batch's loss metrics {sorted(metrics)} differ from the step's first "
                             f"{sorted(self.names)}")
        if self.names:
            self.sums += torch.stack([torch.as_tensor(metrics[name], dtype=torch.float64, device=self.device)
                                      for name in self.names])
        self.micro_batches += 1

    def reduce(self) -> tuple[float, dict[str, float]]:
        """Collective: ``J`` over all ranks and each metric's mean over every micro-batch of the step."""
        packed = torch.cat([self.objective.reshape(1), self.sums,
                            torch.tensor([self.micro_batches], dtype=torch.float64, device=self.device)])
        dist.all_reduce(packed)
        totals = packed.tolist()
        num_micro_batches = totals[-1]
        return totals[0], {name: total / num_micro_batches for name, total in zip(self.names, totals[1:-1])}


def select_over_step(root: PolicyWithTokenLoss, micro_batches: list[dict], *, sft: SFTConfig,
                     env: DistEnv) -> list[dict]:
    """Collective. For a loss that selects over the whole optimiser step (``TokenLoss.selects_over_step``): the extra
    arguments of each of this rank's micro-batches for its forward, ``weights`` (its share of one ``weigh`` over every
    row of the step on every rank), ``statistics`` (its rows' statistics, which the loss head reuses) and
    ``ref_hidden`` (so the reference trunk runs once); ``{}`` for every other loss.

    A no-grad pass over this rank's micro-batches computes their statistics; all ranks gather them in the step's
    micro-batch order (micro-batch m is rank m mod world_size's, ``sft.data.DataOrder``), so every rank weighs the same
    rows in the same order as one micro-batch holding the whole step would, and keeps its own micro-batches' shares.
    """
    if not root.token_loss.selects_over_step:
        return [{} for _ in micro_batches]
    local = []
    with torch.no_grad():
        for mb in micro_batches:
            with autocast_context(env, sft.mixed_precision):
                local.append(root(**mb, statistics_only=True))
    names = sorted(local[0].stats.values)
    shapes = torch.tensor([[part.stats.num_sequences, part.stats.vocab_size] for part in local], device=env.device)
    per_rank_shapes = all_gather_blocks([shapes], env)
    per_rank_rows = all_gather_blocks([part.stats.to_rows() for part in local], env)
    order = [(rank, j) for j in range(len(local)) for rank in range(env.world_size)]
    everything = [TokenStats.from_rows(per_rank_rows[rank][j], names, *per_rank_shapes[rank][0][j].tolist())
                  for rank, j in order]
    weights = root.token_loss.weigh(TokenStats.concat(everything))
    shares = weights.split([part.num_rows for part in everything])
    mine = [shares[order.index((env.rank, j))] for j in range(len(local))]
    return [{"weights": share, "statistics": part.stats.values,
             **({"ref_hidden": part.ref_hidden} if part.ref_hidden is not None else {})}
            for share, part in zip(mine, local)]


def train_step(root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer, micro_batches: list[dict],
               *, sft: SFTConfig, env: DistEnv) -> StepResult:
    """One optimiser step over this rank's ``micro_batches`` (already on the device)."""
    # 1. count: supervised tokens of the whole step on every rank, before any forward
    local_tokens = [supervised_token_count(mb["labels"]) for mb in micro_batches]
    local_inputs = sum(int(mb["attention_mask"].sum()) if mb["attention_mask"] is not None else mb["input_ids"].numel()
                       for mb in micro_batches)
    counts = torch.tensor([sum(local_tokens), local_inputs], dtype=torch.float64, device=env.device)
    dist.all_reduce(counts)
    step_tokens, step_inputs = int(counts[0]), int(counts[1])

    # 2. forward/backward; FSDP2 averages gradients over ranks, so each rank back-propagates world_size · w_m · L_m
    step_metrics = StepMetrics(env.device)
    loss_norm = sft.effective_loss_norm()  # a method's own loss_norm wins (EKSFT official_code)
    step_selection = select_over_step(root, micro_batches, sft=sft, env=env)
    for mb, selection, num_tokens in zip(micro_batches, step_selection, local_tokens):
        weight = micro_batch_weight(loss_norm, num_tokens=num_tokens, step_tokens=step_tokens,
                                    grad_accum=sft.grad_accum, world_size=env.world_size)
        with autocast_context(env, sft.mixed_precision):
            result = root(**{**mb, **selection})
        (result.loss * (weight * env.world_size)).backward()
        step_metrics.add(weight, result.loss, result.metrics)

    # 3. clip and step
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in root.policy.parameters() if p.requires_grad],
                                               sft.grad_clip if sft.grad_clip > 0 else float("inf"))
    if isinstance(grad_norm, DTensor):
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    objective, metrics = step_metrics.reduce()
    return StepResult(loss=objective, grad_norm=float(grad_norm), supervised_tokens=step_tokens,
                      input_tokens=step_inputs, metrics=metrics)


# ------------------------------------------------------------------------------------------------ loop
def keep_metrics_up_to(metrics_path: Path, step: int) -> None:
    """On resume: lines logged after the checkpoint's step move to ``metrics.superseded.jsonl`` (they get redone)."""
    if not metrics_path.exists():
        return
    kept, superseded = [], []
    for line in metrics_path.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.strip():
            (kept if json.loads(line)["step"] <= step else superseded).append(line)
    if superseded:
        with open(metrics_path.with_name(SUPERSEDED_METRICS_FILE), "a", encoding="utf-8") as handle:
            handle.writelines(superseded)
    metrics_path.write_text("".join(kept), encoding="utf-8")


@dataclass
class TrainSummary:
    """What a finished training loop reports (headline metrics of the manifest)."""

    steps: int
    total_steps: int
    supervised_tokens: int
    input_tokens: int
    final_loss: float
    train_time_s: float
    """Optimiser-step time summed over every launch (checkpointing and refreshes excluded)."""
    resumed_from_step: int | None
    steps_this_launch: int


def step_micro_batches(step: int, *, rows: list[TokenisedRow], order: DataOrder, pad_token_id: int, env: DistEnv,
                       reference_cache: ReferenceCache | None, phase_times: dict[str, float]) -> list[dict]:
    """This rank's collated micro-batches of optimiser step ``step`` on the device, with their rows' cached reference
    hidden states (``ref_hidden``) when there is a ``reference_cache`` (read time added to ``phase_times``)."""
    micro_batches = []
    for mb in order.rank_micro_batches(step, env.rank):
        batch = collate([rows[i] for i in mb], pad_token_id)
        if reference_cache is not None:
            started = time.perf_counter()
            batch["ref_hidden"] = reference_cache.batch(mb, batch["input_ids"].shape[1])
            phase_times["time/reference_cache_read_s"] = \
                phase_times.get("time/reference_cache_read_s", 0.0) + time.perf_counter() - started
        micro_batches.append({k: (v.to(env.device) if v is not None else None) for k, v in batch.items()})
    return micro_batches


def fit(root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler, checkpointer: Checkpointer, state: TrainerState, *,
        rows: list[TokenisedRow], order: DataOrder, pad_token_id: int, sft: SFTConfig, env: DistEnv,
        logger: MetricsLogger, show_progress: bool, log_every: int,
        reference_cache: ReferenceCache | None = None) -> TrainSummary:
    """Trains from ``state`` (``Checkpointer.restore_or_start``) until ``total_optimizer_steps``."""
    total_steps = total_optimizer_steps(sft, order.steps_per_epoch)
    resumed_from = state.global_step or None  # checkpoints exist only after a step, so step 0 is a fresh start
    needs_old_policy = root.old_policy is not None
    refresh_every = root.token_loss.old_policy_refresh_every if needs_old_policy else 0
    if needs_old_policy and (not isinstance(refresh_every, int) or refresh_every < 1):
        raise ValueError(f"the loss needs an old policy but old_policy_refresh_every is {refresh_every!r}")
    root.train()
    bar = progress(total=total_steps, initial=state.global_step, desc="sft", unit="step", enabled=show_progress)
    unlogged_times: dict[str, float] = {}  # checkpoint saves made after the last logged line
    for step in range(state.global_step, total_steps):
        root.token_loss.begin_step(step)
        phase_times: dict[str, float] = {}
        if needs_old_policy and step % refresh_every == 0:
            started = time.perf_counter()
            refresh_old_policy(root)
            phase_times["time/old_policy_refresh_s"] = time.perf_counter() - started
        micro_batches = step_micro_batches(step, rows=rows, order=order, pad_token_id=pad_token_id, env=env,
                                           reference_cache=reference_cache, phase_times=phase_times)
        lr = scheduler.get_last_lr()[0]
        started = time.perf_counter()
        result = train_step(root, optimizer, micro_batches, sft=sft, env=env)
        scheduler.step()
        step_time = time.perf_counter() - started

        done = step + 1
        epoch, index = order.position(done)
        state = dataclasses.replace(
            state, global_step=done, total_steps=total_steps, epoch=epoch, index_in_epoch=index,
            world_size=env.world_size, supervised_tokens=state.supervised_tokens + result.supervised_tokens,
            input_tokens=state.input_tokens + result.input_tokens, train_time_s=state.train_time_s + step_time,
            last_loss=result.loss)
        peak = max_over_ranks(peak_memory_gib(env), env)
        if done % log_every == 0 or done == total_steps:
            logger.log(done, {"loss": result.loss, "grad_norm": result.grad_norm, "lr": lr,
                              "epoch": done / order.steps_per_epoch, "supervised_tokens": result.supervised_tokens,
                              "input_tokens": result.input_tokens, "tokens_per_s": result.input_tokens / step_time,
                              "time/step_s": step_time, "peak_memory_gib": peak, **unlogged_times, **phase_times,
                              **{sft_stat_key(k): v for k, v in result.metrics.items()}})
            unlogged_times = {}
        # The step's line is written before its checkpoint: a resume from that checkpoint keeps the lines up to it,
        # so a crash between the two must not leave the step without its line. The save is timed on the next line.
        at_epoch_end = done % order.steps_per_epoch == 0
        if (sft.checkpoint_every and done % sft.checkpoint_every == 0) or at_epoch_end or done == total_steps:
            started = time.perf_counter()
            checkpointer.save(state, root, optimizer, scheduler)
            unlogged_times["time/checkpoint_s"] = \
                unlogged_times.get("time/checkpoint_s", 0.0) + time.perf_counter() - started
        bar.set_postfix(loss=f"{result.loss:.4f}", lr=f"{lr:.2e}", refresh=False)
        bar.update(1)
    bar.close()
    return TrainSummary(steps=state.global_step, total_steps=total_steps, supervised_tokens=state.supervised_tokens,
                        input_tokens=state.input_tokens, final_loss=state.last_loss, train_time_s=state.train_time_s,
                        resumed_from_step=resumed_from, steps_this_launch=state.global_step - (resumed_from or 0))
