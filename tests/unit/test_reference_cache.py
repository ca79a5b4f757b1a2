"""The reference cache's files without a model: shard plan, disk estimate and shortfall, resumable build, reads."""
from __future__ import annotations

import shutil
from collections import namedtuple

import pytest
import torch

from common.manifest import read_manifest, write_manifest
from sft import reference_cache
from sft.reference_cache import (
    ReferenceCache,
    ReferenceCacheError,
    build_reference_cache,
    cache_identity,
    identity_key,
    shard_name,
    shard_plan,
)

HIDDEN = 4
ROWS = [[5, 1, 2], [7, 7, 7, 7, 7], [3, 4], [9, 8, 7, 6]]


def identity(mixed_precision: str = "bf16") -> dict:
    return cache_identity(base_model_sha256="b" * 64, sft_tokens_sha256="t" * 64, attn_implementation="sdpa",
                          gguf_file=None, device_type="cpu", mixed_precision=mixed_precision, kernels={})


class FakeTrunk:
    """``hidden[0, i, j] = id_i + j / 8`` (exact in bf16); records the lengths it was called with."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.calls.append(input_ids.shape[1])
        return input_ids.float().unsqueeze(-1) + torch.arange(HIDDEN) / 8


def build(folder, trunk, messages=None, **kwargs):
    return build_reference_cache(folder, identity(), input_ids=ROWS, hidden_size=HIDDEN, hidden_states=trunk,
                                 rank=0, world_size=1, announce=print if messages is None else messages.append, **kwargs)


def test_shard_plan_closes_a_shard_once_it_holds_the_target_bytes():
    assert shard_plan([3, 5, 2, 4], bytes_per_token=10, shard_bytes=60) == [(0, 2), (2, 4)]
    assert shard_plan([3, 5, 2, 4], bytes_per_token=10, shard_bytes=1000) == [(0, 4)]
    assert shard_plan([9, 1], bytes_per_token=10, shard_bytes=20) == [(0, 1), (1, 2)]


def test_identity_names_precision_and_contents():
    assert identity("bf16")["dtype"] == "bfloat16" and identity("fp32")["dtype"] == "float32"
    assert identity_key(identity("bf16")) != identity_key(identity("fp32"))


def test_build_prints_the_estimate_writes_bf16_rows_and_reads_them_zero_padded(tmp_path):
    trunk, messages = FakeTrunk(), []
    manifest = build(tmp_path, trunk, messages, shard_bytes=64)  # 8 bytes per token: rows 0-1 fill 64 bytes
    assert "14 tokens x 4 x 2 bytes = 112 bytes in 2 shard(s); 2 to write (112 bytes)" in messages[0]
    assert manifest.complete and manifest.details["bytes"] == 14 * HIDDEN * 2
    assert [s["start"] for s in manifest.details["shards"]] == [0, 2] and trunk.calls == [3, 5, 2, 4]
    cache = ReferenceCache(tmp_path, identity())
    batch = cache.batch([3, 2], length=4)
    assert batch.dtype == torch.bfloat16 and batch.shape == (2, 4, HIDDEN)
    torch.testing.assert_close(batch[0].float(), trunk(torch.tensor([ROWS[3]]))[0])
    torch.testing.assert_close(batch[1, :2].float(), trunk(torch.tensor([ROWS[2]]))[0])
    assert (batch[1, 2:] == 0).all()
    with pytest.raises(ReferenceCacheError, match="5 tokens, the batch 4"):
        cache.batch([1], length=4)


def test_complete_cache_is_not_rebuilt_and_an_interrupted_one_writes_only_missing_shards(tmp_path):
    build(tmp_path, FakeTrunk(), shard_bytes=64)
    untouched = (tmp_path / shard_name(0)).stat().st_ino  # a rewrite renames a new file into place
    again = FakeTrunk()
    build(tmp_path, again, shard_bytes=64)
    assert again.calls == []

    manifest = read_manifest(tmp_path)  # as if killed before shard 1 was renamed into place
    manifest.status = "running"
    write_manifest(tmp_path, manifest)
    (tmp_path / shard_name(1)).unlink()
    with pytest.raises(ReferenceCacheError, match="not complete"):
        ReferenceCache(tmp_path, identity())
    resumed = FakeTrunk()
    assert build(tmp_path, resumed, shard_bytes=64).complete
    assert resumed.calls == [2, 4] and (tmp_path / shard_name(0)).stat().st_ino == untouched
    assert ReferenceCache(tmp_path, identity()).row(3).shape == (4, HIDDEN)


def test_disk_shortfall_names_free_and_needed_space_before_writing(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(reference_cache.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 50, 50))
    trunk = FakeTrunk()
    with pytest.raises(ReferenceCacheError, match=r"needs 118 bytes more disk .* only 50 bytes is free: short by 68 bytes"):
        build(tmp_path, trunk)
    assert trunk.calls == [] and read_manifest(tmp_path) is None
    assert reference_cache.shutil is shutil
