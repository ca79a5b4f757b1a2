"""Shared test setup: CPU-friendly threading, the default CPU kernel pins (``profile.cpu_isa=avx2``, what every
stage process runs with) and vLLM-CPU settings, applied before anything imports torch or vLLM; and the
tiers: a test's folder is its tier (``tests/unit``, ``tests/integration``, ``tests/e2e``, ``tests/gpu``), marked
from the folder; a tier marker outside its folder, or a unit test that reads ``../shared``, stops the collection; and
on pytest-xdist workers the slow test files first in each worker's share (``tests/suite_order.py``)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import suite_order
from common.numerics import CPU_ISAS, pinned_kernels_env
from common.tracking import bound_openmp_spin

# vLLM-CPU: in-process engine with one OpenMP thread starts in ~4 s (vs 25-60 s spawned); docs/evaluation.md.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
bound_openmp_spin()
pinned_kernels_env(os.environ, "cpu", CPU_ISAS[0])
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # torch.compile in-process: no pool of compile workers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
TIERS = ("unit", "integration", "e2e", "gpu")


def _tier(item: pytest.Item) -> str | None:
    relative = item.path.relative_to(Path(__file__).parent)
    return relative.parts[0] if len(relative.parts) > 1 and relative.parts[0] in TIERS else None


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(suite_order, "suite_order")  # the slow files first on each xdist worker


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        tier = _tier(item)
        if tier is None:
            misplaced.append(f"{item.nodeid}: not in a tier folder ({', '.join(f'tests/{t}' for t in TIERS)})")
            continue
        item.add_marker(tier)
        other = sorted({mark.name for mark in item.iter_markers()} & set(TIERS) - {tier})
        if other:
            misplaced.append(f"{item.nodeid}: marked {other} but lives in tests/{tier}/ (move it to tests/{other[0]}/)")
        if tier == "unit" and "shared_data" in item.fixturenames:
            misplaced.append(f"{item.nodeid}: a unit test reads ../shared (move it to tests/integration/)")
    if misplaced:
        raise pytest.UsageError("tests outside their tier:\n" + "\n".join(misplaced))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (real benchmark files, LUFFY prompt); tests read it by path, never copy it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not found (the shared reference data sits beside the checkout)")
    return SHARED_DATA


@pytest.fixture(scope="module")
def checker():
    """A running BFCL checker (``eval.bfcl.checker.BfclChecker`` in its own venv); skips when ``make bfcl-env`` has
    not run."""
    from eval.bfcl.checker import BfclChecker, bfcl_python

    if not bfcl_python().exists():
        pytest.skip(f"no BFCL checker venv at {bfcl_python()} (make bfcl-env)")
    with BfclChecker() as running:
        yield running
