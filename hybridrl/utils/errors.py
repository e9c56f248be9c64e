"""The user-facing error type every layer raises for a setting it cannot use.

It lives here, below config/, because a layer that reads a setting (the log level in utils/logs.py, a reader, a
registry name) must raise what the entry points print as a config mistake without importing the config package
above it. `hybridrl.config.ConfigError` is this class.
"""
from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing config mistake; the message names the key and the fix."""
