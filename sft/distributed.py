"""This process's place in the SFT process group: torchrun's group, or a 1-rank group outside torchrun (the same
FSDP2 code path either way), and the few collectives the trainer needs beyond FSDP2's own."""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist


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


def init_distributed(device_type: str, timeout_s: float | None = None) -> DistEnv:
    """Joins torchrun's group (env:// rendezvous) or, outside torchrun, makes a 1-rank group: same FSDP2 code path.

    gloo on CPU, NCCL on CUDA (one GPU per local rank). ``timeout_s``: how long any collective of the group waits
    (``sft.process_group_timeout_s``); None keeps torch's default (10 minutes).
    """
    if device_type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    owns_group = not dist.is_initialized()  # else reuse it (e.g. the 1-rank group an in-process vLLM engine leaves)
    if owns_group:
        options = {"device_id": device if device.type == "cuda" else None}
        if timeout_s is not None:
            options["timeout"] = timedelta(seconds=timeout_s)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, **options)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **options)
    return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device, owns_group=owns_group)


def close_distributed(env: DistEnv) -> None:
    if env.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def wait_for_main(work: Callable[[], Any], env: DistEnv, timeout_s: float) -> None:
    """Collective: rank 0 runs ``work`` (e.g. a model download) while the other ranks wait at a barrier of a gloo
    group of their own with ``timeout_s``, so a long wait is not bounded by the main group's timeout and no NCCL
    collective is pending meanwhile."""
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    try:
        if env.is_main:
            work()
        dist.barrier(group=group)
    finally:
        dist.destroy_process_group(group)


def broadcast_from_main(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (any picklable object)."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def peak_memory_gib(env: DistEnv) -> float:
    """Peak memory of this rank: CUDA max allocated, or the process's peak RSS on CPU, in GiB."""
    if env.device.type == "cuda":
        return torch.cuda.max_memory_allocated(env.device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def max_over_ranks(value: float, env: DistEnv) -> float:
    box = torch.tensor([value], dtype=torch.float64, device=env.device)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return float(box)


def all_gather_blocks(blocks: list[torch.Tensor], env: DistEnv) -> list[list[torch.Tensor]]:
    """Collective: every rank's ``blocks`` as ``[rank][i]``. Every rank gives as many blocks, 2-D of one dtype and
    width; their row counts may differ (each rank's rows are padded to the longest for the one all-gather)."""
    counts = torch.tensor([block.shape[0] for block in blocks], dtype=torch.int64, device=env.device)
    all_counts = [torch.empty_like(counts) for _ in range(env.world_size)]
    dist.all_gather(all_counts, counts)
    local = torch.cat(blocks)
    longest = max(int(rank_counts.sum()) for rank_counts in all_counts)
    padded = torch.cat([local, local.new_zeros(longest - local.shape[0], local.shape[1])])
    gathered = [torch.empty_like(padded) for _ in range(env.world_size)]
    dist.all_gather(gathered, padded)
    return [list(rows[:int(rank_counts.sum())].split(rank_counts.tolist()))
            for rows, rank_counts in zip(gathered, all_counts)]
