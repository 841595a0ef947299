"""The errors of plugin lookup and loading: each is a usage error (one line, exit status 2)."""

from __future__ import annotations

from launcher.errors import UsageError

__all__ = ["InvalidPluginError", "PluginConflictError", "PluginLoadError", "PluginNotFoundError"]


class PluginNotFoundError(UsageError):
    """No installed plugin provides the requested name."""


class PluginConflictError(UsageError):
    """Two plugins provide the same name for the same kind."""


class PluginLoadError(UsageError):
    """The plugin that provides the requested name failed to import."""


class InvalidPluginError(UsageError):
    """A plugin implements a hook that does not exist, or implements one wrongly."""
