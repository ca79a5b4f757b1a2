"""The SFT trainer: FSDP2 under torchrun, one loop for every token-loss method, resumable.

The trainer never branches on a method name, only on the capability flags of the loss built by
``sft.losses.build_loss``: ``needs_reference`` (a frozen copy of the base model, never refreshed) and
``needs_old_policy`` (a frozen copy of the policy, refreshed every ``old_policy_refresh_every`` optimiser steps).
With ``sft.reference_cache`` the reference trunk never runs during training: its final hidden states are read per
micro-batch from ``sft.reference_cache`` and only the reference's LM head (``reference_head``) stays in the root.

FSDP2 layout: every decoder layer of every model (policy, reference, old policy) is its own ``fully_shard`` unit;
the root unit is :class:`PolicyWithTokenLoss`, whose ``forward`` runs the trunks *and* the chunked loss head, so the
root pre-forward unshards the head weights (tied to the embeddings in Qwen3-4B) for exactly that call. The model's
own full-logits forward is never used for training: the trunk's final hidden states and the head weight go to
``sft.token_stats.chunked_loss``, the only code that builds ``[tokens x vocab]`` tensors.

One optimiser step has three phases (torchtitan's ``train_step``): count the step's supervised tokens on every rank
(before any forward), forward/backward each micro-batch with its ``sft.loss_norm`` weight, then clip and step.

Run folder (``common.paths.sft_dir``)::

    checkpoints/step_<N>/    DCP shards (policy, optimiser, old policy) + rank<r>.pt (RNG, scheduler)
                             + trainer_state.json (written last: the checkpoint's completion marker)
    metrics.jsonl            one line per logged optimiser step
"""
from __future__ import annotations

import json
import math
import os
import random
import resource
import shutil
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from common.config import SFTConfig
from common.tracking import MetricsLogger, progress
from sft.data import DataOrder, TokenisedRow, collate, supervised_token_count
from sft.reference_cache import ReferenceCache
from sft.token_stats import LossResult, chunked_loss

CHECKPOINTS_DIR = "checkpoints"
TRAINER_STATE_FILE = "trainer_state.json"
SUPERSEDED_METRICS_FILE = "metrics.superseded.jsonl"
LOSS_NORMS = ("micro_batch_mean", "micro_batch_sum", "global_token_mean")


class ResumeError(RuntimeError):
    """A checkpoint cannot continue this run (different world size or schedule); the message says why."""


# ------------------------------------------------------------------------------------------ distributed
@dataclass
class DistEnv:
    """This process's place in the (possibly 1-rank) process group."""

    rank: int
    world_size: int
    device: torch.device
    owns_group: bool
    """True when :func:`init_distributed` created the group (and :func:`close_distributed` destroys it)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_type: str) -> DistEnv:
    """Joins torchrun's group (env:// rendezvous) or, outside torchrun, makes a 1-rank group: same FSDP2 code path.

    gloo on CPU, NCCL on CUDA (one GPU per local rank).
    """
    if device_type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    owns_group = not dist.is_initialized()  # else reuse it (e.g. the 1-rank group an in-process vLLM engine leaves)
    if owns_group:
        device_id = device if device.type == "cuda" else None
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, device_id=device_id)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, device_id=device_id)
    return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device, owns_group=owns_group)


def close_distributed(env: DistEnv) -> None:
    if env.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_from_main(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (any picklable object)."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ----------------------------------------------------------------------------------- schedule and weights
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


def micro_batch_weight(loss_norm: str, *, num_tokens: int, step_tokens: int, grad_accum: int,
                       world_size: int) -> float:
    """Weight ``w_m`` of micro-batch objective ``L_m`` in the step objective ``J = Σ_ranks Σ_m w_m · L_m``.

    * ``micro_batch_mean``: ``1 / (grad_accum · world_size)``, the mean of every micro-batch objective of the step
      (methods_spec D13 spec default);
    * ``micro_batch_sum``: ``1 / world_size``, the sum over a rank's micro-batches and the mean over ranks (the
      official EKSFT code: HF Trainer does not divide by gradient accumulation, DeepSpeed averages ranks);
    * ``global_token_mean``: ``num_tokens / step_tokens``, each micro-batch weighted by its share of the step's
      supervised tokens over all ranks (counted before the forward, torchtitan style); for a token-mean loss
      such as plain SFT, ``J`` is the token mean over the whole step.
    """
    if loss_norm == "micro_batch_mean":
        return 1.0 / (grad_accum * world_size)
    if loss_norm == "micro_batch_sum":
        return 1.0 / world_size
    if loss_norm == "global_token_mean":
        return num_tokens / max(1, step_tokens)
    raise ValueError(f"sft.loss_norm must be one of {list(LOSS_NORMS)}; got {loss_norm!r}")


# ---------------------------------------------------------------------------------------------- models
def freeze(model: PreTrainedModel) -> PreTrainedModel:
    model.requires_grad_(False)
    return model.eval()


def final_hidden_states(model: PreTrainedModel, input_ids: torch.Tensor,
                        attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The trunk's last hidden states ``[B, L, d]`` after the final norm (no logits)."""
    return model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


class PolicyWithTokenLoss(nn.Module):
    """FSDP2 root: the policy plus the frozen models its loss needs; ``forward`` returns the micro-batch loss.

    Called with ``labels=None`` it returns the policy's logits instead (only for the export check). With
    ``reference_head`` instead of ``reference`` (the reference cache), ``forward`` takes the reference's final hidden
    states as ``ref_hidden [B, L, d]`` and applies only that head.
    """

    def __init__(self, policy: PreTrainedModel, token_loss: Any, chunk_size: int,
                 reference: PreTrainedModel | None = None, old_policy: PreTrainedModel | None = None,
                 reference_head: nn.Module | None = None):
        super().__init__()
        if reference is not None and reference_head is not None:
            raise ValueError("give the reference model or its cached head, not both")
        self.policy = policy
        self.reference = reference
        self.reference_head = reference_head
        self.old_policy = old_policy
        self.token_loss = token_loss
        self.chunk_size = chunk_size

    def models(self) -> list[PreTrainedModel]:
        return [m for m in (self.policy, self.reference, self.old_policy) if m is not None]

    def train(self, mode: bool = True) -> "PolicyWithTokenLoss":
        super().train(mode)
        for frozen in (self.reference, self.reference_head, self.old_policy):
            if frozen is not None:
                frozen.eval()
        return self

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, ref_hidden: torch.Tensor | None = None) -> LossResult | torch.Tensor:
        if labels is None:
            return self.policy(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        frozen: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            if self.reference is not None:
                frozen["ref_hidden"] = final_hidden_states(self.reference, input_ids, attention_mask)
                frozen["ref_head_weight"] = self.reference.get_output_embeddings().weight
            elif self.reference_head is not None:
                if ref_hidden is None:
                    raise ValueError("the reference comes from sft.reference_cache: pass its rows as ref_hidden")
                frozen["ref_hidden"] = ref_hidden
                frozen["ref_head_weight"] = self.reference_head.weight
            if self.old_policy is not None:
                frozen["old_hidden"] = final_hidden_states(self.old_policy, input_ids, attention_mask)
                frozen["old_head_weight"] = self.old_policy.get_output_embeddings().weight
        hidden = final_hidden_states(self.policy, input_ids, attention_mask)
        return chunked_loss(self.token_loss, hidden, self.policy.get_output_embeddings().weight, labels,
                            chunk_size=self.chunk_size, **frozen)


def shard_models(root: PolicyWithTokenLoss, env: DistEnv, mixed_precision: str) -> None:
    """``fully_shard`` each decoder layer of each model, then the root (embeddings, final norms, heads)."""
    mesh = init_device_mesh(env.device.type, (env.world_size,))
    policy = mixed_precision_policy(env, mixed_precision)
    for model in root.models():
        for layer in model.get_decoder().layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(root, mesh=mesh, mp_policy=policy)


def mixed_precision_policy(env: DistEnv, mixed_precision: str) -> MixedPrecisionPolicy:
    # On GPU FSDP2 casts parameters to bf16 for compute and reduces gradients in fp32; on CPU bf16 autocast does
    # the casting instead (see autocast_context), which this CPU runs 4-5x faster than fp32 matmuls.
    if env.device.type == "cuda" and mixed_precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def sharded_reference_trunk(reference: PreTrainedModel, env: DistEnv,
                            mixed_precision: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The frozen reference's trunk sharded on its own (each decoder layer, then the trunk) as a no-grad function
    ``input_ids [B, L] → final hidden states``, under the training autocast and parameter dtype: the live
    reference's forward inside :class:`PolicyWithTokenLoss`, for building ``sft.reference_cache``."""
    trunk = freeze(reference).get_decoder()
    mesh = init_device_mesh(env.device.type, (env.world_size,))
    policy = mixed_precision_policy(env, mixed_precision)
    for layer in trunk.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(trunk, mesh=mesh, mp_policy=policy)

    @torch.no_grad()
    def hidden_states(input_ids: torch.Tensor) -> torch.Tensor:
        with autocast_context(env, mixed_precision):
            return trunk(input_ids=input_ids.to(env.device), use_cache=False).last_hidden_state

    return hidden_states


def frozen_head_copy(model: PreTrainedModel) -> nn.Linear:
    """A frozen ``nn.Linear`` holding a copy of ``model``'s LM-head weight (tied or not)."""
    weight = model.get_output_embeddings().weight
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(weight)
    return head.requires_grad_(False).eval()


def autocast_context(env: DistEnv, mixed_precision: str):
    if env.device.type == "cpu" and mixed_precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext()


@torch.no_grad()
def refresh_old_policy(root: PolicyWithTokenLoss) -> None:
    """Copies the policy's (sharded) weights into the old policy: same mesh and placements, so a local copy."""
    old_params = dict(root.old_policy.named_parameters())
    for name, param in root.policy.named_parameters():
        old_params[name].copy_(param)


def build_optimizer(root: PolicyWithTokenLoss, sft: SFTConfig) -> torch.optim.AdamW:
    """AdamW on the policy; no weight decay on 1-D parameters (norm weights, biases), as HF Trainer does."""
    params = [p for p in root.policy.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": sft.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=sft.lr, betas=tuple(sft.betas), eps=sft.adam_eps)


def build_scheduler(optimizer: torch.optim.Optimizer, sft: SFTConfig,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = num_warmup_steps(total_steps, sft.warmup_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(
        step, total_steps=total_steps, warmup_steps=warmup, schedule=sft.lr_schedule, min_lr_ratio=sft.min_lr_ratio))


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
    objective = torch.zeros((), dtype=torch.float64, device=env.device)
    metric_sums: dict[str, float] = {}
    loss_norm = sft.effective_loss_norm()  # a method's own loss_norm wins (EKSFT official_code)
    for mb, num_tokens in zip(micro_batches, local_tokens):
        weight = micro_batch_weight(loss_norm, num_tokens=num_tokens, step_tokens=step_tokens,
                                    grad_accum=sft.grad_accum, world_size=env.world_size)
        with autocast_context(env, sft.mixed_precision):
            result = root(**mb)
        (result.loss * (weight * env.world_size)).backward()
        objective += weight * result.loss.detach().double()
        for key, value in result.metrics.items():
            metric_sums[key] = metric_sums.get(key, 0.0) + float(value)

    # 3. clip and step
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in root.policy.parameters() if p.requires_grad],
                                               sft.grad_clip if sft.grad_clip > 0 else float("inf"))
    if isinstance(grad_norm, DTensor):
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    dist.all_reduce(objective)
    gathered: list[tuple[dict[str, float], int]] = [None] * env.world_size  # type: ignore[list-item]
    dist.all_gather_object(gathered, (metric_sums, len(micro_batches)))
    totals: dict[str, float] = {}
    for sums, _ in gathered:
        for key, value in sums.items():
            totals[key] = totals.get(key, 0.0) + value
    num_micro_batches = sum(n for _, n in gathered)
    return StepResult(loss=float(objective), grad_norm=float(grad_norm), supervised_tokens=step_tokens,
                      input_tokens=step_inputs, metrics={k: v / num_micro_batches for k, v in totals.items()})


def peak_memory_gib(env: DistEnv) -> float:
    """Peak memory of this rank: CUDA max allocated, or the process's peak RSS on CPU, in GiB."""
    if env.device.type == "cuda":
        return torch.cuda.max_memory_allocated(env.device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def max_over_ranks(value: float, env: DistEnv) -> float:
    box = torch.tensor([value], dtype=torch.float64, device=env.device)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return float(box)


# ---------------------------------------------------------------------------------------- checkpoints
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
    """Resumable DCP checkpoints in ``<run>/checkpoints/step_<N>``; a checkpoint counts once its state file exists."""

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

    def latest(self) -> Path | None:
        steps = self.complete_steps()
        return self.path(steps[-1]) if steps else None

    def clear(self) -> None:
        """Removes every checkpoint (a fresh start must never resume a stale run's weights)."""
        if self.env.is_main and self.root.exists():
            shutil.rmtree(self.root)
        dist.barrier()

    @staticmethod
    def _sharded_state(root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        state = {"policy": get_model_state_dict(root.policy),
                 "optimizer": get_optimizer_state_dict(root.policy, optimizer)}
        if root.old_policy is not None:
            state["old_policy"] = get_model_state_dict(root.old_policy)
        return state

    def save(self, step: int, root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer,
             scheduler: torch.optim.lr_scheduler.LRScheduler, trainer_state: dict[str, Any]) -> Path:
        path = self.path(step)
        if self.env.is_main and path.exists():
            shutil.rmtree(path)  # a partial folder left by a crash during an earlier save
        dist.barrier()
        dcp.save(self._sharded_state(root, optimizer), checkpoint_id=str(path))
        torch.save({"rng": rng_state(), "scheduler": scheduler.state_dict()}, path / f"rank{self.env.rank}.pt")
        dist.barrier()
        if self.env.is_main:
            tmp = path / f".{TRAINER_STATE_FILE}.tmp"
            tmp.write_text(json.dumps(trainer_state, indent=2, sort_keys=True))
            os.replace(tmp, path / TRAINER_STATE_FILE)
            for old in self.complete_steps()[:-self.keep]:
                shutil.rmtree(self.path(old))
        dist.barrier()
        return path

    def load(self, path: Path, root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer,
             scheduler: torch.optim.lr_scheduler.LRScheduler, *, total_steps: int) -> dict[str, Any]:
        """Restores everything saved in ``path``; returns its trainer state (raises :class:`ResumeError` first if the
        checkpoint belongs to another world size or schedule)."""
        trainer_state = json.loads((path / TRAINER_STATE_FILE).read_text())
        if trainer_state["world_size"] != self.env.world_size:
            raise ResumeError(f"{path} was written by {trainer_state['world_size']} ranks, this run has "
                              f"{self.env.world_size}: the global batch (and data order) would change; relaunch "
                              "with the original number of processes or delete the checkpoints to restart")
        if trainer_state["total_steps"] != total_steps:
            raise ResumeError(f"{path} planned {trainer_state['total_steps']} optimiser steps, this run plans "
                              f"{total_steps}; delete the checkpoints to restart")
        state = self._sharded_state(root, optimizer)
        dcp.load(state, checkpoint_id=str(path))
        set_model_state_dict(root.policy, state["policy"])
        set_optimizer_state_dict(root.policy, optimizer, state["optimizer"])
        if root.old_policy is not None:
            set_model_state_dict(root.old_policy, state["old_policy"])
        rank_state = torch.load(path / f"rank{self.env.rank}.pt", weights_only=False)
        scheduler.load_state_dict(rank_state["scheduler"])
        set_rng_state(rank_state["rng"])
        return trainer_state


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


# ------------------------------------------------------------------------------------------------ loop
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


def total_optimizer_steps(sft: SFTConfig, steps_per_epoch: int) -> int:
    planned = steps_per_epoch * sft.epochs
    return planned if sft.max_steps == -1 else min(planned, sft.max_steps)


def restore_or_start(checkpointer: Checkpointer, root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer,
                     scheduler: torch.optim.lr_scheduler.LRScheduler, *, order: DataOrder, total_steps: int,
                     resume: bool, announce: Callable[[str], None] = print) -> dict[str, Any]:
    """The training state to start from: the newest complete checkpoint's when ``resume``, else step 0 (and a fresh
    start deletes every checkpoint, so a stale run's weights can never be picked up later)."""
    latest = checkpointer.latest() if resume else None
    if latest is None:
        if resume:
            announce(f"[sft] no complete checkpoint in {checkpointer.root}; starting from step 0")
        else:
            checkpointer.clear()
        return {"global_step": 0, "supervised_tokens": 0, "input_tokens": 0, "train_time_s": 0.0,
                "last_loss": math.nan, "resumed_from_step": None}
    state = checkpointer.load(latest, root, optimizer, scheduler, total_steps=total_steps)
    epoch, index = order.position(state["global_step"])
    announce(f"[sft] RESUMING from {latest} after optimiser step {state['global_step']}/{total_steps}: "
             f"epoch {epoch}, row {index} of that epoch's order")
    return {**state, "resumed_from_step": state["global_step"]}


def fit(root: PolicyWithTokenLoss, optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler, checkpointer: Checkpointer, state: dict[str, Any], *,
        rows: list[TokenisedRow], order: DataOrder, pad_token_id: int, sft: SFTConfig, env: DistEnv,
        logger: MetricsLogger, show_progress: bool, log_every: int,
        reference_cache: ReferenceCache | None = None) -> TrainSummary:
    """Trains from ``state`` (see :func:`restore_or_start`) until ``total_optimizer_steps``; with
    ``reference_cache`` each micro-batch carries its rows' cached reference hidden states (``ref_hidden``)."""
    total_steps = total_optimizer_steps(sft, order.steps_per_epoch)
    resumed_from = state["resumed_from_step"]
    needs_old_policy = root.old_policy is not None
    refresh_every = root.token_loss.old_policy_refresh_every if needs_old_policy else 0
    if needs_old_policy and (not isinstance(refresh_every, int) or refresh_every < 1):
        raise ValueError(f"the loss needs an old policy but old_policy_refresh_every is {refresh_every!r}")
    root.train()
    bar = progress(total=total_steps, initial=state["global_step"], desc="sft", unit="step", enabled=show_progress)
    for step in range(state["global_step"], total_steps):
        root.token_loss.begin_step(step)
        phase_times = {}
        if needs_old_policy and step % refresh_every == 0:
            started = time.perf_counter()
            refresh_old_policy(root)
            phase_times["time/old_policy_refresh_s"] = time.perf_counter() - started
        micro_batches = []
        for mb in order.rank_micro_batches(step, env.rank):
            batch = collate([rows[i] for i in mb], pad_token_id)
            if reference_cache is not None:
                started = time.perf_counter()
                batch["ref_hidden"] = reference_cache.batch(mb, batch["input_ids"].shape[1])
                phase_times["time/reference_cache_read_s"] = \
                    phase_times.get("time/reference_cache_read_s", 0.0) + time.perf_counter() - started
            micro_batches.append({k: (v.to(env.device) if v is not None else None) for k, v in batch.items()})
        lr = scheduler.get_last_lr()[0]
        started = time.perf_counter()
        result = train_step(root, optimizer, micro_batches, sft=sft, env=env)
        scheduler.step()
        step_time = time.perf_counter() - started

        done = step + 1
        epoch, index = order.position(done)
        state = {"global_step": done, "total_steps": total_steps, "epoch": epoch, "index_in_epoch": index,
                 "world_size": env.world_size, "supervised_tokens": state["supervised_tokens"] +
                 result.supervised_tokens, "input_tokens": state["input_tokens"] + result.input_tokens,
                 "train_time_s": state["train_time_s"] + step_time, "last_loss": result.loss}
        at_epoch_end = done % order.steps_per_epoch == 0
        if (sft.checkpoint_every and done % sft.checkpoint_every == 0) or at_epoch_end or done == total_steps:
            started = time.perf_counter()
            checkpointer.save(done, root, optimizer, scheduler, state)
            phase_times["time/checkpoint_s"] = time.perf_counter() - started
        peak = max_over_ranks(peak_memory_gib(env), env)
        if done % log_every == 0 or done == total_steps:
            logger.log(done, {"loss": result.loss, "grad_norm": result.grad_norm, "lr": lr,
                              "epoch": done / order.steps_per_epoch, "supervised_tokens": result.supervised_tokens,
                              "input_tokens": result.input_tokens, "tokens_per_s": result.input_tokens / step_time,
                              "time/step_s": step_time, "peak_memory_gib": peak, **phase_times,
                              **{f"stats/{k}": v for k, v in result.metrics.items()}})
        bar.set_postfix(loss=f"{result.loss:.4f}", lr=f"{lr:.2e}", refresh=False)
        bar.update(1)
    bar.close()
    return TrainSummary(steps=state["global_step"], total_steps=total_steps,
                        supervised_tokens=state["supervised_tokens"], input_tokens=state["input_tokens"],
                        final_loss=state["last_loss"], train_time_s=state["train_time_s"],
                        resumed_from_step=resumed_from,
                        steps_this_launch=state["global_step"] - (resumed_from or 0))
