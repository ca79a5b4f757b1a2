"""The frozen reference's final hidden states for the tokenised SFT split, written once and read every step.

The reference model (the base model, never refreshed) sees the same sequences every epoch, so its trunk's output
is computed once (``sft.reference_cache=true``); each training step then reads its micro-batch's rows and only the
reference's LM head runs, chunk by chunk, in ``sft.token_stats``. Losses that do not ``needs_reference`` ignore it.

Layout (one folder per identity, ``common.paths.reference_cache_dir``)::

    manifest.json              common.manifest: config = the identity below, status running | complete,
                               details = shards, rows, tokens, bytes, build time
    shard_00000.safetensors    rows [start, end) of the split: tensor "<row index>" = [row length, hidden]

Identity (its hash names the folder): sha256 of the base model and of the tokenised split, the model's attention
implementation and GGUF file, the device type, ``sft.mixed_precision``, the storage dtype and the CPU kernels
(``common.paths.kernels_identity``, empty for the pinned default). Every method of every
experiment with that identity shares the folder.

Storage dtype = the loss head's compute dtype (bf16 under ``mixed_precision=bf16`` on CPU and GPU, fp32 otherwise):
the head casts the reference's hidden states to exactly that dtype before its matmul, so storing them in it loses
nothing. Disk: ``tokens × hidden × bytes`` (bf16: Qwen3-4B 5 KiB per token, Qwen3-8B 8 KiB).

Exactness: each row is computed alone (batch 1, no padding) by the same sharded forward under the same autocast as
the live reference, so a step whose micro-batches hold one sequence gets bitwise the live reference's loss and
gradients. With several sequences per micro-batch the live reference runs a padded batch, whose kernels may
round differently (fp32: ~1e-6 relative; bf16: an occasional last-bit flip of a hidden state) — the cache then
holds the unpadded, per-sequence values.

Building is collective (every rank runs the sharded reference): shards are dealt round-robin to ranks, every rank
runs the same number of forwards (padding its list with a one-token dummy), and each shard is written atomically
(temp file + rename), so an interrupted build resumes with the missing shards only.
"""
from __future__ import annotations

import bisect
import datetime
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from common.manifest import Manifest, config_hash, read_manifest, write_manifest
from common.models import follow_umask

CACHE_STAGE = "sft_reference_cache"
"""``Manifest.stage`` of a cache folder."""
SHARD_BYTES = 256 * 2**20
"""Target size of one shard file."""
FREE_DISK_MARGIN = 1.05
"""Free disk demanded per byte still to write (file system overhead)."""


class ReferenceCacheError(RuntimeError):
    """The cache cannot be written (not enough free disk) or read (incomplete, or not the data it is asked for)."""


def storage_dtype(mixed_precision: str) -> torch.dtype:
    """The loss head's compute dtype for the reference's hidden states: bf16 under bf16 mixed precision, else fp32."""
    return torch.bfloat16 if mixed_precision == "bf16" else torch.float32


def cache_identity(*, base_model_sha256: str, sft_tokens_sha256: str, attn_implementation: str | None,
                   gguf_file: str | None, device_type: str, mixed_precision: str, kernels: dict[str, Any],
                   frozen_dtype: str = "fp32") -> dict[str, Any]:
    """Everything the cached hidden states depend on; ``config_hash`` of it names the cache folder. The reference's
    storage dtype (``sft.frozen_dtype``) is named only when not fp32, so caches built before it existed keep their
    folders."""
    return {"base_model_sha256": base_model_sha256, "sft_tokens_sha256": sft_tokens_sha256,
            "attn_implementation": attn_implementation, "gguf_file": gguf_file, "device_type": device_type,
            "mixed_precision": mixed_precision, "dtype": str(storage_dtype(mixed_precision)).removeprefix("torch."),
            **({} if frozen_dtype == "fp32" else {"frozen_dtype": frozen_dtype}), **kernels}


def identity_key(identity: dict[str, Any]) -> str:
    return config_hash(identity)


def shard_plan(lengths: Sequence[int], bytes_per_token: int, shard_bytes: int = SHARD_BYTES) -> list[tuple[int, int]]:
    """Consecutive row ranges ``[start, end)``, each closed once it holds ``shard_bytes`` (at least one row)."""
    plan, start, size = [], 0, 0
    for index, length in enumerate(lengths):
        size += length * bytes_per_token
        if size >= shard_bytes:
            plan.append((start, index + 1))
            start, size = index + 1, 0
    if start < len(lengths):
        plan.append((start, len(lengths)))
    return plan


def shard_name(shard: int) -> str:
    return f"shard_{shard:05d}.safetensors"


def format_bytes(size: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size:.0f} bytes"


def check_free_disk(folder: Path, needed: int) -> None:
    """Raises :class:`ReferenceCacheError` naming free and needed bytes when ``folder``'s disk cannot take
    ``needed`` bytes (times :data:`FREE_DISK_MARGIN`)."""
    free = shutil.disk_usage(folder).free
    if free < needed * FREE_DISK_MARGIN:
        raise ReferenceCacheError(
            f"reference cache in {folder} needs {format_bytes(needed * FREE_DISK_MARGIN)} more disk (including "
            f"{FREE_DISK_MARGIN - 1:.0%} margin) but only {format_bytes(free)} is free: short by "
            f"{format_bytes(needed * FREE_DISK_MARGIN - free)}; free space or set sft.reference_cache=false")


def build_reference_cache(folder: Path, identity: dict[str, Any], *, input_ids: Sequence[Sequence[int]],
                          hidden_size: int, hidden_states: Callable[[torch.Tensor], torch.Tensor],
                          rank: int, world_size: int, announce: Callable[[str], None] = print,
                          shard_bytes: int = SHARD_BYTES) -> Manifest:
    """Collective: writes the missing shards of ``folder`` and returns its complete manifest.

    ``hidden_states(ids [1, L]) -> [1, L, hidden_size]`` is the reference trunk's no-grad forward (sharded, under
    the training autocast); ``input_ids`` are the split's rows in file order. A complete manifest with this
    identity returns at once; a running one (an interrupted build) keeps its finished shards.
    """
    dtype = storage_dtype(identity["mixed_precision"])
    bytes_per_token = hidden_size * dtype.itemsize
    lengths = [len(ids) for ids in input_ids]
    plan = shard_plan(lengths, bytes_per_token, shard_bytes)
    chash = identity_key(identity)
    status: dict[str, Any] | None = None
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        previous = read_manifest(folder)
        if previous is not None and previous.complete and previous.config_hash == chash:
            status = {"complete": True}
        else:
            missing = [k for k in range(len(plan)) if not (folder / shard_name(k)).is_file()] \
                if previous is not None and previous.config_hash == chash else list(range(len(plan)))
            needed = sum(lengths[i] for k in missing for i in range(*plan[k])) * bytes_per_token
            announce(f"[sft] reference cache {folder}: {sum(lengths)} tokens x {hidden_size} x {dtype.itemsize} "
                     f"bytes = {format_bytes(sum(lengths) * bytes_per_token)} in {len(plan)} shard(s); "
                     f"{len(missing)} to write ({format_bytes(needed)})")
            error = None
            try:
                check_free_disk(folder, needed)
            except ReferenceCacheError as exc:
                error = str(exc)
            status = {"complete": False, "missing": missing, "error": error}
            if error is None:
                write_manifest(folder, Manifest(stage=CACHE_STAGE, variant=chash, config_hash=chash,
                                                config=identity, details=_details(plan, lengths, bytes_per_token)))
    status = _broadcast(status, world_size)
    if status["complete"]:
        return read_manifest(folder)
    if status["error"]:
        raise ReferenceCacheError(status["error"])

    started = time.perf_counter()
    mine = status["missing"][rank::world_size]
    rounds = max((sum(plan[k][1] - plan[k][0] for k in status["missing"][r::world_size])
                  for r in range(world_size)), default=0)
    work = [(k, i) for k in mine for i in range(*plan[k])]
    shard_rows: dict[str, torch.Tensor] = {}
    for step in range(rounds):
        if step >= len(work):  # keep the collectives of a sharded forward in step with the other ranks
            hidden_states(torch.zeros((1, 1), dtype=torch.long))
            continue
        shard, index = work[step]
        hidden = hidden_states(torch.tensor([input_ids[index]], dtype=torch.long))
        if tuple(hidden.shape) != (1, lengths[index], hidden_size):
            raise ReferenceCacheError(f"reference hidden states of row {index} have shape {tuple(hidden.shape)}, "
                                      f"expected (1, {lengths[index]}, {hidden_size})")
        shard_rows[str(index)] = hidden[0].to(dtype).cpu().contiguous()
        if index == plan[shard][1] - 1:
            _write_shard(folder / shard_name(shard), shard_rows)
            shard_rows = {}
    if world_size > 1:
        dist.barrier()
    if rank == 0:
        absent = [shard_name(k) for k in range(len(plan)) if not (folder / shard_name(k)).is_file()]
        if absent:
            raise ReferenceCacheError(f"reference cache {folder}: shards {absent} missing after the build")
        manifest = read_manifest(folder)
        manifest.status = "complete"
        manifest.ended_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        manifest.details["build_time_s"] = manifest.details.get("build_time_s", 0.0) + time.perf_counter() - started
        write_manifest(folder, manifest)
        announce(f"[sft] reference cache complete: {folder} ({manifest.details['build_time_s']:.1f} s)")
    if world_size > 1:
        dist.barrier()
    return read_manifest(folder)


def _details(plan: list[tuple[int, int]], lengths: list[int], bytes_per_token: int) -> dict[str, Any]:
    return {"rows": len(lengths), "tokens": sum(lengths), "bytes_per_token": bytes_per_token,
            "bytes": sum(lengths) * bytes_per_token,
            "shards": [{"file": shard_name(k), "start": start, "end": end} for k, (start, end) in enumerate(plan)]}


def _write_shard(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp))
    follow_umask(tmp)
    os.replace(tmp, path)


def _broadcast(value: Any, world_size: int) -> Any:
    if world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class ReferenceCache:
    """Reads a complete cache folder: the rows of one micro-batch as a zero-padded ``[B, L, hidden]`` tensor."""

    def __init__(self, folder: Path, identity: dict[str, Any]):
        manifest = read_manifest(folder)
        if manifest is None or not manifest.complete or manifest.config_hash != identity_key(identity):
            raise ReferenceCacheError(f"reference cache {folder} is not complete for this base model and data "
                                      f"(manifest status {None if manifest is None else manifest.status})")
        self.folder = folder
        self.dtype = storage_dtype(identity["mixed_precision"])
        self.num_rows = manifest.details["rows"]
        self.hidden_size = manifest.details["bytes_per_token"] // self.dtype.itemsize
        shards = manifest.details["shards"]
        self._starts = [shard["start"] for shard in shards]
        self._files = [folder / shard["file"] for shard in shards]
        self._open: dict[int, Any] = {}

    def row(self, index: int) -> torch.Tensor:
        """``[row length, hidden]`` hidden states of row ``index`` of the split."""
        if not 0 <= index < self.num_rows:
            raise ReferenceCacheError(f"row {index} is outside the cached split of {self.num_rows} rows")
        shard = bisect.bisect_right(self._starts, index) - 1
        if shard not in self._open:
            self._open[shard] = safe_open(str(self._files[shard]), framework="pt", device="cpu")
        return self._open[shard].get_tensor(str(index))

    def batch(self, indices: Sequence[int], length: int) -> torch.Tensor:
        """The rows ``indices`` right-padded with zeros to ``length`` (as ``sft.data.collate`` pads the tokens)."""
        out = torch.zeros((len(indices), length, self.hidden_size), dtype=self.dtype)
        for position, index in enumerate(indices):
            hidden = self.row(index)
            if hidden.shape[0] > length:
                raise ReferenceCacheError(f"cached row {index} has {hidden.shape[0]} tokens, the batch {length}")
            out[position, :hidden.shape[0]] = hidden
        return out
