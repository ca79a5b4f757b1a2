"""The project's base error types, in a module that imports nothing: any module may raise them, however early it
loads (``common.numerics`` runs in verl's plugin before any config exists)."""
from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key and what is allowed."""
