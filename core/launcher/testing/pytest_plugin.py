"""pytest plugin shipped with launcher: fixtures for testing plugins.

Enabled automatically (entry point ``pytest11``); with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` set,
enable it with ``-p launcher.testing.pytest_plugin`` or ``pytest_plugins = ["launcher.testing.pytest_plugin"]``
in a conftest. Fixtures:

``plugin_manager``
    a fresh :class:`~launcher.plugins.manager.LauncherPluginManager` with the installed
    entry-point plugins loaded (the ``LAUNCHER_*`` switches of the environment are ignored).
``register_plugin``
    ``register_plugin(obj)`` registers a plugin object on that manager for one test.
``launcher_store_server``
    a running :class:`~launcher.store.server.StoreServer` on a free loopback port, closed
    after the test: a store service for backends that talk the TCPStore protocol.

The conformance suites that use these fixtures are in :mod:`launcher.testing`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from launcher.plugins.manager import LauncherPluginManager, get_plugin_manager
from launcher.store.server import StoreServer


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
        if plugin_manager.is_registered(plugin):
            plugin_manager.unregister(plugin)


@pytest.fixture
def launcher_store_server() -> Iterator[StoreServer]:
    """A started :class:`~launcher.store.server.StoreServer` on ``127.0.0.1`` and a free port."""
    server = StoreServer("127.0.0.1", 0).start()
    try:
        yield server
    finally:
        server.close()
