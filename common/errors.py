"""The project's base error types, in a module that imports nothing: any module may raise them, however early it
loads (``common.numerics`` runs in verl's plugin before any config exists)."""
from __future__ import annotations


class UserError(Exception):
    """An error whose message names what to change (a config key, a file and its row, a lock's holder) and how: an
    entry point (``common.config.stage_main``, the orchestrator) prints it alone, without a traceback."""


class ConfigError(UserError, ValueError):
    """An invalid configuration value; the message names the key and what is allowed."""
