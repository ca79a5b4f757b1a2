"""The CPU environment of every stage: bounded OpenMP spinning, defined once (``common.tracking.CPU_OPENMP_ENV``:
set where unset, never over a value the user chose), and the kernel pins of ``profile.cpu_isa``
(``common.numerics``), in the environment of every CPU stage the orchestrator starts."""
from __future__ import annotations

from common.numerics import PINNED_KERNELS_ENV
from common.tracking import CPU_OPENMP_ENV, bound_openmp_spin
from pipeline.launch import stage_environment


def test_spin_bound_is_set_where_unset_and_kept_where_chosen():
    assert CPU_OPENMP_ENV == {"GOMP_SPINCOUNT": "10000"}
    assert bound_openmp_spin({"PATH": "/bin"}) == {"PATH": "/bin", "GOMP_SPINCOUNT": "10000"}
    assert bound_openmp_spin({"GOMP_SPINCOUNT": "0"}) == {"GOMP_SPINCOUNT": "0"}


def test_cpu_stages_get_the_spin_bound(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert stage_environment("cpu", "avx2")["GOMP_SPINCOUNT"] == "10000"
    assert "GOMP_SPINCOUNT" not in stage_environment("cuda", "avx2")


def test_cpu_stages_get_the_kernel_pins_over_inherited_values(monkeypatch):
    assert PINNED_KERNELS_ENV["avx2"] == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT",
                                          "ONEDNN_MAX_CPU_ISA": "AVX2"}
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    env = stage_environment("cpu", "avx2")
    assert {key: env[key] for key in PINNED_KERNELS_ENV["avx2"]} == PINNED_KERNELS_ENV["avx2"]
    assert stage_environment("cpu", "native")["ATEN_CPU_CAPABILITY"] == "avx512"  # native: whatever the user set
    assert stage_environment("cuda", "avx2")["ATEN_CPU_CAPABILITY"] == "avx512"
