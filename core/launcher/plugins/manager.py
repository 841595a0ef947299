"""Finding, loading and selecting plugins.

:func:`get_plugin_manager` builds a fresh :class:`LauncherPluginManager`; nothing is loaded at
import time, so tests and embedders get a clean manager whenever they ask for one.

Switches (environment variables, read when the manager is built):

``LAUNCHER_DISABLE_PLUGIN_AUTOLOAD=1``
    load only the core's own plugins, none from other distributions.
``LAUNCHER_PLUGINS=a,b``
    load only these plugins (entry-point names) from other distributions; empty loads none.
``LAUNCHER_BLOCK_PLUGINS=a,b``
    never load these plugins (entry-point names), the core's own included.
``LAUNCHER_PLUGIN_TRACEBACKS=1``
    print the full traceback of a plugin that fails to load.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pluggy

from launcher.errors import UsageError
from launcher.plugins import entrypoints
from launcher.plugins.hookspec import HOOKS_BY_KIND, PROJECT, LauncherSpecs
from launcher.plugins.types import LogsSpecsProvider, Registration, RendezvousBackend

log = logging.getLogger("launcher.plugins")

#: The entry-point group every launcher plugin, built-in or third-party, registers under.
ENTRY_POINT_GROUP = "launcher"
#: The distribution that ships the core; its plugins are never blocked by the allowlist.
CORE_DISTRIBUTION = "launcher"

R = TypeVar("R", bound=Registration)


@dataclass
class PluginInfo:
    """What is known about one plugin, loaded or not."""

    name: str
    distribution: str | None
    version: str | None
    group: str
    value: str
    loaded: bool = False
    error: str | None = None
    traceback: str | None = None

    @property
    def builtin(self) -> bool:
        return self.distribution == CORE_DISTRIBUTION

    def describe(self) -> str:
        """``name (dist version)``, as used in error messages."""
        if self.distribution:
            return f"{self.name!r} ({self.distribution} {self.version})"
        return repr(self.name)


@dataclass(frozen=True)
class Provided:
    """One registration and the plugin that provided it."""

    registration: Registration
    plugin: PluginInfo


class PluginNotFoundError(UsageError):
    """No installed plugin provides the requested name."""


class PluginConflictError(UsageError):
    """Two plugins provide the same name for the same kind."""


class PluginLoadError(UsageError):
    """The plugin that provides the requested name failed to import."""


def _split_names(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


class LauncherPluginManager(pluggy.PluginManager):
    """A pluggy manager that also knows each plugin's distribution and selects by name."""

    def __init__(
        self,
        *,
        autoload: bool = True,
        allow: Iterable[str] | None = None,
        block: Iterable[str] = (),
        show_tracebacks: bool = False,
    ) -> None:
        super().__init__(PROJECT)
        self.add_hookspecs(LauncherSpecs)
        self.autoload = autoload
        self.allow = None if allow is None else set(allow)
        self.block = set(block)
        self.show_tracebacks = show_tracebacks
        self._infos: dict[int, PluginInfo] = {}
        self._failures: list[PluginInfo] = []
        self._entrypoints_loaded = False
        self._cache: dict[str, dict[str, Provided]] = {}
        # Entry-point groups torch defines for torchrun, honoured after launcher's own plugins.
        self._foreign: dict[str, list[Provided]] = {}

    # -- registration ------------------------------------------------------------------------

    def register_plugin(self, plugin: object, info: PluginInfo | None = None) -> None:
        """Register ``plugin`` (a module or object with hook implementations)."""
        name = info.name if info else getattr(plugin, "__name__", None) or repr(plugin)
        if info is None:
            info = PluginInfo(name=name, distribution=None, version=None, group="<direct>", value=name)
        info.loaded = True
        self.register(plugin, name=name)
        self._infos[id(plugin)] = info
        self._cache.clear()

    def load_entrypoint_plugins(self) -> None:
        """Import and register every allowed plugin of the ``launcher`` entry-point group.

        Also reads torch's ``torchrun.logs_specs`` group. Safe to call more than once.
        """
        if self._entrypoints_loaded:
            return
        self._entrypoints_loaded = True
        seen: set[tuple[str | None, str]] = set()
        for ep in entrypoints.entry_points(ENTRY_POINT_GROUP):
            info = PluginInfo(
                name=ep.name,
                distribution=ep.distribution,
                version=ep.version,
                group=ENTRY_POINT_GROUP,
                value=ep.value,
            )
            key = (info.distribution, info.name)
            if key in seen:  # the same distribution found twice on sys.path
                continue
            seen.add(key)
            if not self._allowed(info):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not break the launcher
                self._record_failure(info, exc)
                continue
            try:
                self.register_plugin(plugin, info)
            except ValueError:  # already registered under this name (same module twice)
                continue
        self._load_torchrun_groups()
        self._cache.clear()

    def _allowed(self, info: PluginInfo) -> bool:
        if info.name in self.block:
            return False
        if info.builtin:
            return True
        if not self.autoload:
            return False
        return self.allow is None or info.name in self.allow

    def _record_failure(self, info: PluginInfo, exc: BaseException) -> None:
        import traceback

        info.error = f"{type(exc).__name__}: {exc}"
        info.traceback = traceback.format_exc()
        self._failures.append(info)
        log.warning("plugin %s failed to load and was skipped: %s", info.describe(), info.error)
        if self.show_tracebacks:
            log.warning("%s", info.traceback)

    def _load_torchrun_groups(self) -> None:
        """Read torch's own groups, each entry wrapped so that nothing loads until it is chosen.

        ``torchrun.logs_specs`` maps a name to a LogsSpecs class (loading it may import torch);
        ``torchrun.handlers`` maps a name to a function returning a handler creator, run through
        launcher's adapter (which imports torch).
        """
        wrappers: dict[str, Callable[[entrypoints.FoundEntryPoint], Registration]] = {
            "torchrun.logs_specs": lambda ep: LogsSpecsProvider(
                name=ep.name, load_class=ep.load, description=f"torchrun LogsSpecs {ep.value}"
            ),
            "torchrun.handlers": lambda ep: RendezvousBackend(
                name=ep.name,
                description=f"torchrun rendezvous handler {ep.value}",
                create_handler=_TorchrunHandler(ep),
            ),
        }
        for group, wrap in wrappers.items():
            for ep in entrypoints.entry_points(group):
                info = PluginInfo(
                    name=ep.name,
                    distribution=ep.distribution,
                    version=ep.version,
                    group=group,
                    value=ep.value,
                    loaded=True,
                )
                if info.name in self.block:
                    continue
                try:
                    reg = wrap(ep)
                except ValueError as exc:
                    self._record_failure(info, exc)
                    continue
                self._foreign.setdefault(reg.kind, []).append(Provided(reg, info))

    def add_foreign(self, kind: str, provided: Provided) -> None:
        """Add a registration from outside the ``launcher`` group (e.g. ``torchrun.handlers``).

        Foreign registrations only fill names that launcher plugins leave free.
        """
        self._foreign.setdefault(kind, []).append(provided)
        self._cache.pop(kind, None)

    # -- inspection --------------------------------------------------------------------------

    def plugin_infos(self) -> list[PluginInfo]:
        """Every plugin found: loaded ones first, then those that failed."""
        return [*self._infos.values(), *self._failures]

    @property
    def failures(self) -> list[PluginInfo]:
        return list(self._failures)

    def info_for(self, plugin: object) -> PluginInfo:
        return self._infos[id(plugin)]

    def registrations(self, kind: str) -> dict[str, Provided]:
        """Every registration of ``kind``, keyed by each of its names (aliases included).

        Raises :class:`PluginConflictError` when two plugins claim one name.
        """
        if kind in self._cache:
            return self._cache[kind]
        hook = getattr(self.hook, HOOKS_BY_KIND[kind])
        found: dict[str, Provided] = {}
        for impl in reversed(hook.get_hookimpls()):  # registration order, oldest first
            info = self._infos.get(id(impl.plugin)) or PluginInfo(
                name=impl.plugin_name, distribution=None, version=None, group="<direct>", value=""
            )
            result = impl.function(*[{}.get(a) for a in impl.argnames])
            for reg in result or ():
                if not isinstance(reg, Registration) or reg.kind != kind:
                    raise TypeError(
                        f"plugin {info.describe()} returned {reg!r} from {HOOKS_BY_KIND[kind]}; "
                        f"expected {kind} registrations"
                    )
                for name in reg.names:
                    if name in found and found[name].registration is not reg:
                        other = found[name].plugin
                        raise PluginConflictError(
                            f"{kind} {name!r} is provided twice: by plugin {other.describe()} and by "
                            f"plugin {info.describe()}; uninstall one, or block one with "
                            "LAUNCHER_BLOCK_PLUGINS"
                        )
                    found[name] = Provided(reg, info)
        for provided in self._foreign.get(kind, ()):
            for name in provided.registration.names:
                found.setdefault(name, provided)
        self._cache[kind] = found
        return found

    def names(self, kind: str) -> list[str]:
        """Sorted names (aliases included) available for ``kind``."""
        return sorted(self.registrations(kind))

    def get(self, kind: str, name: str) -> Registration:
        """The registration of ``kind`` called ``name``, or a one-line error saying what exists."""
        return self.lookup(kind, name).registration

    def lookup(self, kind: str, name: str) -> Provided:
        """Like :meth:`get`, with the providing plugin."""
        key = name.strip().lower()
        found = self.registrations(kind)
        if key in found:
            return found[key]
        for failed in self._failures:
            dist = (failed.distribution or "").lower().replace("_", "-")
            if key == failed.name.lower() or dist in (f"launcher-{key}", key):
                raise PluginLoadError(
                    f"{kind} {name!r} comes from plugin {failed.describe()}, which failed to load: "
                    f"{failed.error}"
                )
        raise PluginNotFoundError(self._not_found_message(kind, name, sorted(found)))

    def _not_found_message(self, kind: str, name: str, names: list[str]) -> str:
        """``unknown KIND 'x': did you mean ...? choose one of ...``, plus where a known name comes from."""
        import difflib

        from launcher.values import quote

        key = name.strip().lower()
        close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)  # closest first
        guess = f"did you mean {' or '.join(close)}? " if close else ""
        message = f"unknown {kind} {quote(name)}: {guess}choose one of {', '.join(names) or 'none'}"
        hint = ""
        distribution = KNOWN_DISTRIBUTIONS.get((kind, key))
        if distribution is not None:
            hint = (
                f"; {key!r} is provided by the {distribution} distribution: pip install {distribution} "
                f"(from a launcher checkout: pip install ./plugins/{distribution})"
            )
        if self._failures:
            # One of them may be what the user meant: say so rather than only "unknown".
            broken = ", ".join(failed.describe() for failed in self._failures)
            hint += f"; plugins that failed to load: {broken} (LAUNCHER_PLUGIN_TRACEBACKS=1 shows why)"
        return message + hint


class _TorchrunHandler:
    """``create_handler`` for a ``torchrun.handlers`` entry point, loaded on first use."""

    def __init__(self, entry_point: entrypoints.FoundEntryPoint) -> None:
        self._entry_point = entry_point
        self._creator: Any = None

    def __call__(self, params: Any) -> Any:
        if self._creator is None:
            from launcher.rendezvous.torch_handlers import EntryPointCreator

            self._creator = EntryPointCreator(self._entry_point)
        return self._creator(params)


#: Names provided by the plugin distributions shipped in this repository's ``plugins/``: a miss
#: on one of them names the distribution to install. Only real distributions are listed; an
#: unknown name gets no install hint, since any package name made up from it could be anyone's.
KNOWN_DISTRIBUTIONS: Mapping[tuple[str, str], str] = {
    ("rendezvous backend", "etcd"): "launcher-etcd",
    ("rendezvous backend", "etcd-v2"): "launcher-etcd",
    ("event handler", "webhook"): "launcher-webhook",
    ("logs specs", "jsonlogs"): "launcher-jsonlogs",
}


def get_plugin_manager(
    *,
    autoload: bool | None = None,
    allow: Iterable[str] | None = None,
    block: Iterable[str] | None = None,
    load_entrypoints: bool = True,
    environ: Mapping[str, str] | None = None,
) -> LauncherPluginManager:
    """Build a fresh plugin manager, with entry-point plugins loaded unless told otherwise.

    Arguments left as ``None`` come from the ``LAUNCHER_*`` switches described in this module.
    """
    env = os.environ if environ is None else environ
    if autoload is None:
        autoload = env.get("LAUNCHER_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower() in ("", "0", "false", "no")
    if allow is None:
        allow = _split_names(env.get("LAUNCHER_PLUGINS"))
    if block is None:
        block = _split_names(env.get("LAUNCHER_BLOCK_PLUGINS")) or []
    manager = LauncherPluginManager(
        autoload=autoload,
        allow=allow,
        block=block,
        show_tracebacks=env.get("LAUNCHER_PLUGIN_TRACEBACKS", "") not in ("", "0"),
    )
    if load_entrypoints:
        manager.load_entrypoint_plugins()
    return manager


def select(manager: LauncherPluginManager, kind: str, name: str, cls: type[R]) -> R:
    """Typed shortcut for :meth:`LauncherPluginManager.get`."""
    reg = manager.get(kind, name)
    assert isinstance(reg, cls)
    return reg


def registration_rows(manager: LauncherPluginManager) -> list[dict[str, Any]]:
    """One row per registration and per failed plugin, for ``launcher plugins``."""
    rows: list[dict[str, Any]] = []
    for kind in HOOKS_BY_KIND:
        seen: set[int] = set()
        for provided in manager.registrations(kind).values():
            reg = provided.registration
            if id(reg) in seen:
                continue
            seen.add(id(reg))
            rows.append(
                {
                    "kind": kind,
                    "name": reg.name,
                    "aliases": list(reg.aliases),
                    "description": reg.description,
                    "plugin": provided.plugin.name,
                    "group": provided.plugin.group,
                    "distribution": provided.plugin.distribution,
                    "version": provided.plugin.version,
                    "loaded": True,
                    "error": None,
                }
            )
    for failed in manager.failures:
        rows.append(
            {
                "kind": None,
                "name": None,
                "aliases": [],
                "description": "",
                "plugin": failed.name,
                "group": failed.group,
                "distribution": failed.distribution,
                "version": failed.version,
                "loaded": False,
                "error": failed.error,
            }
        )
    return rows

