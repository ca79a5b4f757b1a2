"""One seed per purpose: the split, training, sampling and rollouts each get their own, derived by name."""
from __future__ import annotations

import hashlib
import random


def derive_seed(base_seed: int, purpose: str) -> int:
    """A 31-bit seed for ``purpose`` derived from ``base_seed`` (stable across processes and platforms)."""
    digest = hashlib.sha256(f"{base_seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch (CPU and CUDA) generators."""
    random.seed(seed)
    import numpy as np
    import torch

    np.random.seed(seed)
    torch.manual_seed(seed)
