"""Multi-node SFT on one machine: the orchestrator's per-node SFT command, started twice as two "nodes" of one rank
each (``profile.nnodes=2 profile.nproc_per_node=1``, c10d rendezvous on 127.0.0.1), trains exactly like one node
with two ranks (``torchrun --standalone --nproc_per_node=2``).

Both runs have world size 2, hence the same run identity (the same ``<label>-<id>`` folder, each in its own run
root) and the same micro-batches per global rank; on CPU/gloo a rank's arithmetic does not depend on which node runs
it, so the per-step losses and the exported weights are bitwise equal (tolerance 0).

Three torchrun launches, so it runs in the e2e tier; the default suite keeps the
per-node command (tests/unit/test_orchestrator.py, srun and the run as rendezvous id) and 2 ranks against 1
(tests/integration/test_sft_train.py).
"""
from __future__ import annotations

import shlex
import socket
import sys
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import pytest
import torch

from common.config import compose
from pipeline.launch import run_command, stop_all
from common.manifest import read_manifest
from common.paths import TRAINING_METRICS_FILE, sft_dir, sft_run
from pipeline.stages import StageCommand, torchrun_prefix
from common.tracking import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from sft_helpers import build_tiny_model, final_weights, prepare_run, run_torchrun  # noqa: E402

pytestmark = pytest.mark.e2e

NUM_ROWS = 8
RUN = dict(micro_batch_size=2, grad_accum=1, epochs=1)
"""Global batch 2 x 1 x 2 ranks = 4 rows: two optimiser steps over 8 rows."""
TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def step_records(cfg) -> list[dict]:
    return read_metrics(sft_dir(cfg) / TRAINING_METRICS_FILE)


def test_two_single_rank_nodes_match_one_node_with_two_ranks(tmp_path, monkeypatch):
    model_dir = build_tiny_model(tmp_path / "tiny_qwen3")

    _, one_node = prepare_run(tmp_path / "one_node", model_dir, NUM_ROWS, **RUN)
    one_node = [*one_node, "profile.nproc_per_node=2"]
    result = run_torchrun(one_node, nproc=2, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    one_cfg = compose(one_node)

    _, two_nodes = prepare_run(tmp_path / "two_nodes", model_dir, NUM_ROWS, **RUN)
    two_nodes = [*two_nodes, "profile.nnodes=2", "profile.num_threads=1"]
    two_cfg = compose(two_nodes)
    run_name = sft_run(two_cfg).directory.name
    assert run_name == sft_run(one_cfg).directory.name  # world size 2 either way: one identity
    per_node = [*torchrun_prefix(two_cfg), "-m", "sft.train", *two_nodes]
    assert f"--rdzv_id={run_name}" in per_node and "--standalone" not in per_node

    # every node runs the same command, started once per node by one launcher (srun in a Slurm job; two background
    # shells here), and the orchestrator expands the rendezvous endpoint from its environment
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    node = shlex.join(per_node)
    two_node_launcher = ["bash", "-c", f"{node} & first=$!; {node}; second=$?; wait $first && exit $second"]
    command = StageCommand("sft", "sft/tiny/sft", two_node_launcher, [sft_run(two_cfg)], two_cfg)
    with ThreadPoolExecutor(max_workers=1) as pool:
        launch = pool.submit(run_command, command, echo=False)
        _, running = wait([launch], timeout=TIMEOUT_S)
        if running:
            stop_all()
        log = (command.record_dir / "launch.log").read_text()
        assert not running, f"the two nodes did not finish in {TIMEOUT_S} s:\n{log[-3000:]}"
        assert launch.exception() is None, f"{launch.exception()}\n{log[-3000:]}"
    assert log.count(f"--rdzv_id={run_name}") == 2 and "127.0.0.1:" in log

    one_manifest, two_manifest = read_manifest(sft_dir(one_cfg)), read_manifest(sft_dir(two_cfg))
    assert two_manifest.complete and two_manifest.details["world_size"] == 2
    assert one_manifest.metrics["steps"] == two_manifest.metrics["steps"] == 2
    one_steps, two_steps = step_records(one_cfg), step_records(two_cfg)
    assert [r["step"] for r in two_steps] == [1, 2]
    for key in ("loss", "grad_norm", "lr"):
        assert [r[key] for r in two_steps] == [r[key] for r in one_steps], key
    one_weights, two_weights = final_weights(one_cfg), final_weights(two_cfg)
    assert two_weights.keys() == one_weights.keys()
    for name, weight in one_weights.items():
        torch.testing.assert_close(two_weights[name], weight, rtol=0, atol=0, msg=name)
