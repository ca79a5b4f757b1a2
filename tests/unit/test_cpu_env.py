"""Bounded OpenMP spinning, defined once (``common.tracking.CPU_OPENMP_ENV``): set where unset, never over a value
the user chose, and in the environment of every CPU stage the orchestrator starts."""
from __future__ import annotations

from pipeline.launch import stage_environment
from common.tracking import CPU_OPENMP_ENV, bound_openmp_spin


def test_spin_bound_is_set_where_unset_and_kept_where_chosen():
    assert CPU_OPENMP_ENV == {"GOMP_SPINCOUNT": "10000"}
    assert bound_openmp_spin({"PATH": "/bin"}) == {"PATH": "/bin", "GOMP_SPINCOUNT": "10000"}
    assert bound_openmp_spin({"GOMP_SPINCOUNT": "0"}) == {"GOMP_SPINCOUNT": "0"}


def test_cpu_stages_get_the_spin_bound(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert stage_environment("cpu")["GOMP_SPINCOUNT"] == "10000"
    assert "GOMP_SPINCOUNT" not in stage_environment("cuda")
