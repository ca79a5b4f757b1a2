"""Shared test setup: CPU-friendly threading and vLLM-CPU settings applied before anything imports vLLM."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# vLLM-CPU: in-process engine with one OpenMP thread starts in ~4 s (vs 25-60 s spawned); see docs/cpu.md.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (real benchmark files, LUFFY prompt); tests read it by path, never copy it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not found (the shared reference data sits beside the checkout)")
    return SHARED_DATA
