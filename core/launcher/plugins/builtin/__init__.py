"""Plugins that ship with the core, registered by the core itself (``manager.BUILTIN_PLUGINS``)."""
