"""GPU smoke tier (``make test-gpu``: ``pytest -m gpu tests/gpu``): needs a CUDA torch and GPUs, not vLLM or verl.
Every test here skips on a machine without CUDA; the integration tier's SFT helpers are reused."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
