"""Hub ids against local paths, with no dependency beyond the standard library (``python -m common.preflight stack``
imports it in a bare venv)."""
from __future__ import annotations


def looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id ``org/name``."""
    return path.startswith(("/", ".", "~")) or path.count("/") != 1
