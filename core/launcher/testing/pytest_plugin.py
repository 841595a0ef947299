"""pytest plugin shipped with launcher: fixtures for testing plugins.

Enabled automatically (entry point ``pytest11``). Fixtures:

``plugin_manager``
    a fresh :class:`~launcher.plugins.manager.LauncherPluginManager` with the installed
    entry-point plugins loaded.
``register_plugin``
    ``register_plugin(obj)`` registers a plugin object on that manager for one test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from launcher.plugins.manager import LauncherPluginManager, get_plugin_manager


@pytest.fixture
def plugin_manager() -> Iterator[LauncherPluginManager]:
    """A fresh plugin manager with entry-point plugins loaded."""
    yield get_plugin_manager(environ={})


@pytest.fixture
def register_plugin(plugin_manager: LauncherPluginManager) -> Iterator[Callable[[object], object]]:
    """Register a plugin object (module, class instance) on ``plugin_manager`` for this test."""
    registered: list[object] = []

    def _register(plugin: object) -> object:
        plugin_manager.register_plugin(plugin)
        registered.append(plugin)
        return plugin

    yield _register
    for plugin in registered:
        plugin_manager.unregister(plugin)
