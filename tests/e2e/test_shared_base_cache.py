"""Issue 39, item 2: two experiments that need the same uncached toy base model, started together, both complete.

The base cache (``runs/cache/base/<key>``) is shared by experiments. The second orchestrator waits for the first's
launch of it, naming whose it is, and reuses the model; neither stops the other's processes. The lock and mark logic
alone is tested in seconds by ``tests/unit/test_supervision.py``; this runs the real toy base stage.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.manifest import read_manifest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
TINY_BASE = ["experiment=demo", "experiment.stages=[data,base]", "logging.progress=false", "toy.pretrain_steps=60",
             "toy.num_pretrain_docs=2000", "toy.pretrain_eval_problems=0"]


def _orchestrator(run_root: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline.run", *TINY_BASE, f"experiment.name={name}",
                             f"experiment.run_root={run_root}"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_orchestrators_on_one_uncached_toy_base_both_complete(tmp_path):
    # Started together: whichever takes the base folder's launch lock first builds it, the other waits and reuses it.
    first, second = _orchestrator(tmp_path, "first"), _orchestrator(tmp_path, "second")
    try:
        _, first_err = first.communicate(timeout=1800)
        _, second_err = second.communicate(timeout=1800)
        assert first.returncode == 0 and second.returncode == 0, first_err[-3000:] + second_err[-3000:]
        assert "earlier launch" not in first_err + second_err
        (base,) = tmp_path.glob("cache/base/*")
        waited = [(err, other) for err, other in ((first_err, second), (second_err, first)) if "waiting for it" in err]
        for err, other in waited:  # none when one finished before the other looked (the base was then done)
            assert f"{base} is being run by PID {other.pid} on host" in err
            assert f"reusing the run in {base} that PID {other.pid}" in err
        manifest = read_manifest(base)
        assert manifest.complete and len(manifest.attempts) == 1  # built once
    finally:
        first.kill()
        second.kill()
