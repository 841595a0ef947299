"""What every conformance suite shares: finding the registration under test, and the import check.

:meth:`PluginModuleConformance.registration_under_test` is what each suite's registration fixture
returns; :func:`manager_holding` gives a suite a plugin manager that resolves only the
registration under test, for tests that go through the core's own lookup.

Listing plugins (``launcher plugins``, ``--help``, every launch) imports every plugin module and
calls its hooks, so a plugin module must import quickly and leave heavy libraries (torch, a
cloud SDK) to the factories its registrations carry. :class:`PluginModuleConformance` checks
that in a fresh interpreter.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from typing import Any, ClassVar, TypeVar

import pytest

from launcher.plugins import hookimpl
from launcher.plugins.manager import ENTRY_POINT_GROUP, LauncherPluginManager, get_plugin_manager
from launcher.plugins.types import Registration

__all__ = ["PluginModuleConformance", "manager_holding"]

R = TypeVar("R", bound=Registration)

_PROBE = textwrap.dedent(
    """
    import importlib, json, sys, time
    import launcher.plugins, launcher.plugins.types  # the core's share, not the plugin's
    module, attribute, hook, forbidden = json.loads(sys.argv[1])
    start = time.process_time()  # CPU time: what the import costs, not how busy the machine is
    target = importlib.import_module(module)
    for part in filter(None, attribute.split(".")):
        target = getattr(target, part)
    names = [reg.name for reg in (getattr(target, hook)() or ())]
    elapsed = time.process_time() - start
    loaded = sorted(name for name in forbidden if name in sys.modules)
    print(json.dumps({"elapsed": elapsed, "names": names, "loaded": loaded}))
    """
)


class _OnlyPlugin:
    """A plugin whose hook for one registration's kind yields that registration alone."""

    def __init__(self, registration: Registration) -> None:
        self.registration = registration

        def provide() -> list[Registration]:
            return [registration]

        # The hook's name depends on the kind, so the implementation is set on the instance.
        setattr(self, registration.hook, hookimpl(provide))

    def __repr__(self) -> str:
        return f"<plugin yielding {self.registration.kind} {self.registration.name!r}>"


def manager_holding(registration: Registration) -> LauncherPluginManager:
    """A plugin manager of its own that knows ``registration`` and nothing else.

    A suite resolves the registration under test through it with the core's own code (the
    agent's lookups), whatever else is installed where the tests run.
    """
    manager = get_plugin_manager(load_entrypoints=False)
    manager.register_plugin(_OnlyPlugin(registration))
    return manager


class PluginModuleConformance:
    """Base of every conformance suite.

    A suite sets :attr:`registration_type` and :attr:`registration_fixture`; a test class that uses a suite
    may set:

    ``plugin``
        a plugin object (module or instance) to register on the test's plugin manager, for a
        plugin that is not installed as a distribution;
    ``plugin_module``
        the dotted module (``pkg.mod`` or ``pkg.mod:attr``) whose hook yields the registration,
        when it cannot be found from the plugin manager;
    ``import_time_limit``
        CPU seconds the plugin module may take to import and yield its registrations (default
        0.5; CPU time, so that a loaded machine does not fail a plugin that imports little);
    ``forbidden_imports``
        modules that importing the plugin module must not import (default ``("torch",)``).
    """

    #: The kind under test: its registration class (``RendezvousBackend``); set by each suite.
    registration_type: ClassVar[type[Registration]] = Registration
    #: Name of the fixture that returns the registration under test; set by each suite.
    registration_fixture: ClassVar[str] = ""
    #: A plugin object to register for each test (a plugin that is not installed).
    plugin: ClassVar[object | None] = None
    #: ``pkg.mod`` or ``pkg.mod:attr`` providing the hook, when the manager cannot tell.
    plugin_module: ClassVar[str | None] = None
    #: CPU seconds allowed to import the plugin module and call its hook.
    import_time_limit: ClassVar[float] = 0.5
    #: Modules the plugin module must not import.
    forbidden_imports: ClassVar[tuple[str, ...]] = ("torch",)

    def lookup_registration(self, manager: LauncherPluginManager, name: str | None) -> Registration:
        """The registration of this suite's kind called ``name``, registering :attr:`plugin` first."""
        if self.plugin is not None and not manager.is_registered(self.plugin):
            manager.register_plugin(self.plugin)
        if not name:
            pytest.fail(
                f"{type(self).__name__}: name the {self.registration_type.kind} under test (the suite's *_name class "
                f"attribute) or override the {self.registration_fixture!r} fixture"
            )
        return manager.get(self.registration_type, name)

    def registration_under_test(self, manager: LauncherPluginManager, name: str | None, kind: type[R]) -> R:
        """:meth:`lookup_registration`, typed: what a suite's registration fixture returns.

        ``kind`` is the suite's :attr:`registration_type`, passed again so that the result is typed.
        """
        registration = self.lookup_registration(manager, name)
        assert isinstance(registration, kind)
        return registration

    def _module_of(self, manager: LauncherPluginManager, registration: Registration) -> str:
        if self.plugin_module:
            return self.plugin_module
        try:
            provided = manager.lookup(self.registration_type, registration.name)
        except Exception:
            provided = None
        if provided is None or provided.registration is not registration:
            pytest.skip(f"{registration.name!r} is not registered on the plugin manager; set plugin_module")
        info = provided.plugin
        if info.group == ENTRY_POINT_GROUP:
            return info.value
        module = sys.modules.get(info.name)
        if info.group == "<direct>" and module is not None and manager.is_registered(module):
            return info.name
        pytest.skip(f"{registration.name!r} comes from {info.group!r}, not a launcher plugin module; set plugin_module")

    def test_plugin_module_imports_quickly(self, request: pytest.FixtureRequest, plugin_manager: Any) -> None:
        """The plugin module imports, and yields this registration, fast and without torch."""
        registration: Registration = request.getfixturevalue(self.registration_fixture)
        value = self._module_of(plugin_manager, registration)
        module, _, attribute = value.partition(":")
        importlib.import_module(module.strip())  # a plain import error reads better here
        hook = self.registration_type.hook
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
        args = json.dumps([module.strip(), attribute.strip(), hook, list(self.forbidden_imports)])
        result = subprocess.run(
            [sys.executable, "-c", _PROBE, args], capture_output=True, text=True, timeout=120, env=env
        )
        assert result.returncode == 0, f"importing {value} in a fresh interpreter failed:\n{result.stderr}"
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert registration.name in report["names"], (
            f"{value}.{hook}() did not yield {registration.name!r} (it yielded {report['names']})"
        )
        assert not report["loaded"], (
            f"importing {value} and calling {hook}() imported {report['loaded']}: import heavy "
            "modules inside the registration's factories instead"
        )
        assert report["elapsed"] < self.import_time_limit, (
            f"importing {value} and calling {hook}() took {report['elapsed']:.3f} s "
            f"of CPU time (limit {self.import_time_limit} s); every launch pays this"
        )
