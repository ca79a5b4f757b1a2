"""The SFT process group's timeouts: ``sft.process_group_timeout_s`` reaches ``init_process_group``, and rank 0's
model download is waited for at a barrier of its own (``sft.download_timeout_s``), not under the NCCL group's."""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

import sft.train
from common.config import compose
from sft.distributed import DistEnv


class Stop(Exception):
    """Ends the run right after the call under test."""


def test_the_configured_timeout_reaches_init_process_group(monkeypatch):
    seen = {}

    def init_process_group(backend, **options):
        seen.update(backend=backend, **options)
        raise Stop

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    cfg = compose(["profile=toy", "sft.process_group_timeout_s=5400"])
    with pytest.raises(Stop):
        sft.train.run(cfg)
    assert seen["backend"] == "gloo" and seen["timeout"] == timedelta(seconds=5400)
    assert compose(["profile=paper"]).sft.process_group_timeout_s == 3600  # not torch's 10 minutes


@pytest.mark.parametrize("rank", [0, 1])
def test_a_hub_model_is_downloaded_by_rank_0_behind_a_barrier_with_the_download_timeout(monkeypatch, rank):
    calls = []
    monkeypatch.setattr(sft.train, "local_model_dir", lambda path: calls.append(("download", path)) or "/cache/snap")
    monkeypatch.setattr(dist, "new_group", lambda **options: calls.append(("group", options)) or "downloads")
    monkeypatch.setattr(dist, "barrier", lambda group=None: calls.append(("barrier", group)))
    monkeypatch.setattr(dist, "destroy_process_group", lambda group=None: calls.append(("destroy", group)))
    cfg = compose(["profile=paper", "model=qwen3_4b", "sft.download_timeout_s=9000"])
    env = DistEnv(rank=rank, world_size=2, device=None, owns_group=True)

    assert sft.train.resolve_model_dir(cfg, env) == "/cache/snap"
    rank0_download = [("download", "Qwen/Qwen3-4B")] if rank == 0 else []
    assert calls == [("group", {"backend": "gloo", "timeout": timedelta(seconds=9000)}), *rank0_download,
                     ("barrier", "downloads"), ("destroy", "downloads"), ("download", "Qwen/Qwen3-4B")]
