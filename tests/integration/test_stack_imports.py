"""The GPU smoke tier's stack: SFT and evaluation's HF backend import in a fresh interpreter without vLLM or verl.

(An integration test: the child process imports torch, transformers and the whole SFT stack, seconds of CPU.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_sft_and_hf_evaluation_import_without_vllm_and_verl():
    """The GPU smoke tier runs on a plain CUDA torch: SFT and evaluation's HF backend must not need vLLM or verl."""
    blocked = "import sys; sys.modules.update(vllm=None, verl=None); import sft.train, eval.run, eval.sample"
    result = subprocess.run([sys.executable, "-c", blocked], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
