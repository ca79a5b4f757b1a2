"""The project's base error types, in a module that imports no project module: any module may raise them, however
early it loads (``common.numerics`` runs in verl's plugin before any config exists)."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


class UserError(Exception):
    """An error whose message names what to change (a config key, a file and its row, a lock's holder) and how: an
    entry point (``common.config.stage_main``, the orchestrator) prints it alone, without a traceback."""


class ConfigError(UserError, ValueError):
    """An invalid configuration value; the message names the key and what is allowed."""


@contextlib.contextmanager
def user_errors_in_one_line() -> Iterator[None]:
    """An entry point's body: a :class:`UserError` ends the process with ``error: <message>`` and exit status 1, no
    traceback; with ``HYDRA_FULL_ERROR=1`` it propagates with its traceback (Hydra prints it in full)."""
    try:
        yield
    except UserError as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        raise SystemExit(f"error: {error}") from None
