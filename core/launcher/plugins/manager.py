"""Finding, loading and selecting plugins.

:func:`get_plugin_manager` builds a fresh :class:`LauncherPluginManager`; nothing is loaded at
import time, so tests and embedders get a clean manager whenever they ask for one.

Where plugins come from:

- the core's own, the modules of :data:`BUILTIN_PLUGINS`, registered by the core itself: they
  work without any installed metadata (a source tree on ``PYTHONPATH``, a zipapp, a vendored copy);
- other distributions' plugins, from the ``launcher`` entry-point group;
- torch's ``torchrun.logs_specs`` and ``torchrun.handlers`` groups, which only fill names the
  others leave free.

Registrations are looked up by their class, which is the kind: ``manager.get(RendezvousBackend,
"c10d")`` returns a :class:`~launcher.plugins.types.RendezvousBackend`.

Switches (environment variables, read when the manager is built):

``LAUNCHER_DISABLE_PLUGIN_AUTOLOAD=1``
    load only the core's own plugins, none from other distributions.
``LAUNCHER_PLUGINS=a,b``
    load only these plugins (entry-point names) from other distributions; empty loads none.
``LAUNCHER_BLOCK_PLUGINS=a,b``
    never load these plugins (entry-point names, or a built-in's name such as ``builtin-numa``).
``LAUNCHER_PLUGIN_TRACEBACKS=1``
    print the full traceback of a plugin that fails to load.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pluggy

from launcher import __version__
from launcher.plugins import entrypoints
from launcher.plugins.attribution import Ledger, record_results
from launcher.plugins.errors import (
    InvalidPluginError,
    PluginConflictError,
    PluginLoadError,
    PluginNotFoundError,
)
from launcher.plugins.hookspec import PROJECT, LauncherSpecs
from launcher.plugins.provenance import CORE_DISTRIBUTION, PluginInfo, Provided, is_core_distribution
from launcher.plugins.torchrun_groups import torchrun_registrations
from launcher.plugins.types import (
    REGISTRATION_CLASSES,
    EventHandler,
    HealthCheck,
    LogsSpecsProvider,
    Registration,
    RendezvousBackend,
)

if TYPE_CHECKING:  # pragma: no cover
    from launcher.flags import FlagGroup

__all__ = [
    "BUILTIN_PLUGINS",
    "CORE_DISTRIBUTION",
    "ENTRY_POINT_GROUP",
    "KNOWN_DISTRIBUTIONS",
    "InvalidPluginError",
    "LauncherPluginManager",
    "PluginConflictError",
    "PluginInfo",
    "PluginLoadError",
    "PluginNotFoundError",
    "Provided",
    "builtin_plugin_name",
    "get_plugin_manager",
]

log = logging.getLogger("launcher.plugins")

#: The entry-point group third-party launcher plugins register under.
ENTRY_POINT_GROUP = "launcher"

#: The core's own plugin modules, registered by the core itself rather than through entry points,
#: so that they are there wherever the code is, installed or not. Each is registered under the
#: name :func:`builtin_plugin_name` gives it (``builtin-rendezvous``), which
#: ``LAUNCHER_BLOCK_PLUGINS`` accepts.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "launcher.plugins.builtin.rendezvous",
    "launcher.plugins.builtin.logs_specs",
    "launcher.plugins.builtin.event_handlers",
    "launcher.plugins.builtin.numa",
    "launcher.plugins.builtin.devices",
    "launcher.plugins.builtin.clusters",
    "launcher.plugins.builtin.health_checks",
    "launcher.plugins.builtin.topology",
)

R = TypeVar("R", bound=Registration)


#: Values of an on/off variable that mean off (anything else, such as 1/true/yes, means on).
_OFF = ("", "0", "false", "no", "off")

def builtin_plugin_name(module: str) -> str:
    """``builtin-logs-specs`` for ``launcher.plugins.builtin.logs_specs``."""
    return "builtin-" + module.rsplit(".", 1)[-1].replace("_", "-")


def _split_names(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def _registrations_in(result: object) -> Iterator[object]:
    """The registrations of a hook's result: one list per implementation, or single registrations."""
    for item in result if isinstance(result, Iterable) else (result,):
        if isinstance(item, Registration) or not isinstance(item, Iterable) or isinstance(item, str):
            yield item
        else:
            yield from item


#: The registration class of each hook, from the classes themselves.
_CLASS_OF_HOOK: Mapping[str, type[Registration]] = {cls.hook: cls for cls in REGISTRATION_CLASSES}


class LauncherPluginManager(pluggy.PluginManager):
    """A pluggy manager that also knows each plugin's distribution and selects by name.

    Look registrations up by class: :meth:`get`, :meth:`lookup` (with the providing plugin),
    :meth:`names` and :meth:`registrations`.
    """

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
        self._infos: dict[str, PluginInfo] = {}  # by pluggy plugin name
        self._failures: list[PluginInfo] = []
        self._loaded = False
        self._cache: dict[type[Registration], dict[str, Provided[Registration]]] = {}
        self._ledger: Ledger[PluginInfo] | None = None
        # Entry-point groups torch defines for torchrun, honoured after launcher's own plugins.
        self._foreign: dict[type[Registration], list[Provided[Registration]]] = {}

    # -- registration ------------------------------------------------------------------------

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """pluggy's ``register``; each implementation of launcher's hooks also reports its results.

        See :mod:`launcher.plugins.attribution` for why the functions are wrapped, once, here.
        """
        plugin_name = super().register(plugin, name)
        if plugin_name is not None:
            for caller in self.get_hookcallers(plugin) or ():
                cls = _CLASS_OF_HOOK.get(caller.name)
                if cls is None:
                    continue
                for impl in caller.get_hookimpls():
                    if impl.plugin is plugin:
                        record_results(impl, self._claimer(cls, impl.plugin_name))
        self._cache.clear()
        return plugin_name

    def unregister(self, plugin: object | None = None, name: str | None = None) -> object:
        """pluggy's ``unregister``; what the plugin provided is forgotten too."""
        self._cache.clear()
        return super().unregister(plugin, name)

    def register_plugin(self, plugin: object, info: PluginInfo | None = None) -> None:
        """Register ``plugin`` (a module or object with hook implementations).

        Raises :class:`InvalidPluginError` when it implements a hook that does not exist or
        implements one with the wrong signature; the plugin is not registered then.
        """
        name = info.name if info else getattr(plugin, "__name__", None) or repr(plugin)
        if info is None:
            info = PluginInfo(name=name, distribution=None, version=None, group="<direct>", value=name)
        try:
            self.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise InvalidPluginError(f"plugin {info.describe()} is not a valid launcher plugin: {exc}") from exc
        info.loaded = True
        self._infos[name] = info
        try:
            self.check_pending()
        except pluggy.PluginValidationError as exc:
            message = self._unknown_hook_message(exc.plugin)
            if exc.plugin is plugin:  # leave the manager as it was before this call
                self.unregister(plugin)
            raise InvalidPluginError(message) from exc

    def _unknown_hook_message(self, plugin: object) -> str:
        """``plugin 'x' (dist 1.0) implements unknown hook 'h': did you mean H?``"""
        import difflib

        name = self.get_name(plugin) or repr(plugin)
        info = self._infos.get(name) or PluginInfo(name, None, None, "<direct>", name)
        # An optionalhook implementation has no spec either, yet is allowed (pluggy's check_pending
        # skips it), so it must not be named in place of the hook that is really unknown.
        unknown = next(
            (
                caller.name
                for caller in self.get_hookcallers(plugin) or ()
                if not caller.has_spec()
                and any(impl.plugin is plugin and not impl.optionalhook for impl in caller.get_hookimpls())
            ),
            "?",
        )
        hooks = sorted(_CLASS_OF_HOOK)
        # Compared without the prefix every hook shares, which would make any name look close.
        by_stem = {hook.removeprefix(PROJECT + "_"): hook for hook in hooks}
        close = difflib.get_close_matches(unknown.removeprefix(PROJECT + "_"), list(by_stem), n=1, cutoff=0.6)
        hint = f": did you mean {by_stem[close[0]]}?" if close else f"; launcher's hooks are {', '.join(hooks)}"
        return f"plugin {info.describe()} implements unknown hook {unknown!r}{hint}"

    def load_plugins(self) -> None:
        """Register the core's own plugins, then every allowed plugin of the ``launcher`` group.

        Also reads torch's ``torchrun.logs_specs`` and ``torchrun.handlers`` groups. A plugin
        that fails to import is skipped with a warning; one that implements an unknown hook
        raises :class:`InvalidPluginError`. Safe to call more than once.
        """
        if self._loaded:
            return
        self._loaded = True
        self._load_builtin_plugins()
        self._load_entrypoint_plugins()
        for provided in torchrun_registrations(self.block, self._record_failure):
            self._foreign.setdefault(type(provided.registration), []).append(provided)
        self._cache.clear()

    def _load_builtin_plugins(self) -> None:
        for module in BUILTIN_PLUGINS:
            name = builtin_plugin_name(module)
            if name in self.block:
                continue
            info = PluginInfo(
                name=name, distribution=CORE_DISTRIBUTION, version=__version__, group=ENTRY_POINT_GROUP, value=module
            )
            self.register_plugin(importlib.import_module(module), info)

    def _load_entrypoint_plugins(self) -> None:
        seen: set[tuple[str | None, str]] = set()
        for ep in entrypoints.entry_points(ENTRY_POINT_GROUP):
            if is_core_distribution(ep.distribution):
                # The core registers its own plugins; an older install's metadata may list them.
                continue
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
            if self.is_registered(plugin) or self.has_plugin(info.name):
                continue  # the same module (or name) twice
            self.register_plugin(plugin, info)

    def _allowed(self, info: PluginInfo) -> bool:
        if info.name in self.block:
            return False
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

    # -- collecting registrations ------------------------------------------------------------

    def _claimer(self, cls: type[Registration], plugin_name: str) -> Callable[[object], object]:
        """The ``claim`` of one implementation: checks its registrations and notes their owner."""

        def claim(result: object) -> object:
            owner = self._info(plugin_name)
            found = list(_registrations_in(result))
            for reg in found:
                if not isinstance(reg, cls):
                    raise TypeError(
                        f"plugin {owner.describe()} returned {reg!r} from {cls.hook}; "
                        f"expected {cls.kind} registrations"
                    )
            if self._ledger is not None:
                self._ledger.claim(found, owner)
            if isinstance(result, list):
                return result  # a wrapper's (possibly changed) list, or a plain list: as it is
            return found  # a generator, read once: the list of what it yielded

        return claim

    def _info(self, plugin_name: str) -> PluginInfo:
        return self._infos.get(plugin_name) or PluginInfo(
            name=plugin_name, distribution=None, version=None, group="<direct>", value=""
        )

    def _collect(self, cls: type[R]) -> dict[str, Provided[R]]:
        """Call ``cls.hook`` through pluggy and key what it returns by every name."""
        outer, self._ledger = self._ledger, Ledger()
        ledger = self._ledger
        try:
            result = getattr(self.hook, cls.hook)()
        finally:
            self._ledger = outer
        found: dict[str, Provided[R]] = {}
        # pluggy calls the newest implementation first; read the results in registration order,
        # so that listings show the core's own first and a conflict names the older plugin first.
        for reg in _registrations_in(list(reversed(result))):
            owner = ledger.owner(reg) or PluginInfo("<unknown>", None, None, "<direct>", "")
            if not isinstance(reg, cls):
                raise TypeError(f"{cls.hook} returned {reg!r}; expected {cls.kind} registrations")
            for name in reg.names:
                if name in found and found[name].registration is not reg:
                    other = found[name].plugin
                    raise PluginConflictError(
                        f"{cls.kind} {name!r} is provided twice: by plugin {other.describe()} and by "
                        f"plugin {owner.describe()}; uninstall one, or block one with "
                        "LAUNCHER_BLOCK_PLUGINS"
                    )
                found[name] = Provided(reg, owner)
        for provided in self._foreign.get(cls, ()):
            foreign = cast("Provided[R]", provided)  # filed under its own class, which is cls
            for name in foreign.registration.names:
                found.setdefault(name, foreign)
        return found

    def flag_groups(self) -> list[FlagGroup[Any]]:
        """Every loaded plugin's flag groups (``launcher_flag_groups``), in registration order.

        Each implementation is called once, directly, so that a wrong result names its plugin
        (an :class:`InvalidPluginError`, one line); hook wrappers do not apply to this hook.
        """
        from launcher.flags import FlagGroup

        groups: list[FlagGroup[Any]] = []
        for impl in self.hook.launcher_flag_groups.get_hookimpls():  # registration order
            if impl.hookwrapper or getattr(impl, "wrapper", False):
                continue
            result: Any = impl.function()
            if isinstance(result, FlagGroup) or not hasattr(result, "__iter__"):
                result = [result] if result is not None else []
            for group in result:
                if not isinstance(group, FlagGroup):
                    raise InvalidPluginError(
                        f"plugin {self._info(impl.plugin_name).describe()} returned {group!r} from "
                        "launcher_flag_groups; expected launcher.flags.FlagGroup objects"
                    )
                groups.append(group)
        return groups

    # -- lookup --------------------------------------------------------------------------------

    @property
    def failures(self) -> list[PluginInfo]:
        """The plugins that failed to import."""
        return list(self._failures)

    def registrations(self, cls: type[R]) -> dict[str, Provided[R]]:
        """Every registration of kind ``cls``, keyed by each of its names (aliases included).

        Raises :class:`PluginConflictError` when two plugins claim one name.
        """
        if cls not in self._cache:
            if cls not in REGISTRATION_CLASSES:
                raise TypeError(f"{cls!r} is not a kind of registration; use one of launcher.plugins.types")
            self._cache[cls] = cast("dict[str, Provided[Registration]]", self._collect(cls))
        return cast("dict[str, Provided[R]]", self._cache[cls])

    def unique_registrations(self, cls: type[R]) -> list[Provided[R]]:
        """Every registration of kind ``cls`` once (aliases collapsed), in registration order."""
        unique: dict[int, Provided[R]] = {}
        for provided in self.registrations(cls).values():
            unique.setdefault(id(provided.registration), provided)
        return list(unique.values())

    def names(self, cls: type[Registration]) -> list[str]:
        """Sorted names (aliases included) available for kind ``cls``."""
        return sorted(self.registrations(cls))

    def get(self, cls: type[R], name: str) -> R:
        """The registration of kind ``cls`` called ``name``, or a one-line error saying what exists."""
        return self.lookup(cls, name).registration

    def lookup(self, cls: type[R], name: str) -> Provided[R]:
        """Like :meth:`get`, with the providing plugin."""
        key = name.strip().lower()
        found = self.registrations(cls)
        if key in found:
            return found[key]
        for failed in self._failures:
            dist = (failed.distribution or "").lower().replace("_", "-")
            if key == failed.name.lower() or dist in (f"launcher-{key}", key):
                raise PluginLoadError(
                    f"{cls.kind} {name!r} comes from plugin {failed.describe()}, which failed to load: "
                    f"{failed.error}"
                )
        raise PluginNotFoundError(self._not_found_message(cls, name, sorted(found)))

    def _not_found_message(self, cls: type[Registration], name: str, names: list[str]) -> str:
        """``unknown KIND 'x': did you mean ...? choose one of ...``, plus where a known name comes from."""
        import difflib

        from launcher.values import quote

        key = name.strip().lower()
        close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)  # closest first
        guess = f"did you mean {' or '.join(close)}? " if close else ""
        message = f"unknown {cls.kind} {quote(name)}: {guess}choose one of {', '.join(names) or 'none'}"
        hint = ""
        distribution = KNOWN_DISTRIBUTIONS.get((cls, key))
        if distribution is not None:
            hint = (
                # Not on PyPI (and PyPI's "launcher" is another project): name the checkout's directory.
                f"; {key!r} is provided by the {distribution} distribution, which is not on PyPI: "
                f"pip install ./plugins/{distribution} from a launcher checkout"
            )
        if self._failures:
            # One of them may be what the user meant: say so rather than only "unknown".
            broken = ", ".join(failed.describe() for failed in self._failures)
            hint += f"; plugins that failed to load: {broken} (LAUNCHER_PLUGIN_TRACEBACKS=1 shows why)"
        return message + hint


#: Names provided by the plugin distributions shipped in this repository's ``plugins/``: a miss
#: on one of them names the distribution to install. Only real distributions are listed; an
#: unknown name gets no install hint, since any package name made up from it could be anyone's.
KNOWN_DISTRIBUTIONS: Mapping[tuple[type[Registration], str], str] = {
    (RendezvousBackend, "etcd"): "launcher-etcd",
    (RendezvousBackend, "etcd-v2"): "launcher-etcd",
    (EventHandler, "webhook"): "launcher-webhook",
    (LogsSpecsProvider, "jsonlogs"): "launcher-jsonlogs",
    (HealthCheck, "mounts"): "launcher-nodecheck",
    (HealthCheck, "shm"): "launcher-nodecheck",
}


def get_plugin_manager(
    *,
    autoload: bool | None = None,
    allow: Iterable[str] | None = None,
    block: Iterable[str] | None = None,
    load_entrypoints: bool = True,
    environ: Mapping[str, str] | None = None,
) -> LauncherPluginManager:
    """Build a fresh plugin manager with every plugin loaded (:meth:`~LauncherPluginManager.load_plugins`).

    ``load_entrypoints=False`` gives an empty manager instead, not even with the core's own
    plugins, for a test that registers exactly what it needs. Arguments left as ``None`` come
    from the ``LAUNCHER_*`` switches described in this module.
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
        show_tracebacks=env.get("LAUNCHER_PLUGIN_TRACEBACKS", "").strip().lower() not in _OFF,
    )
    if load_entrypoints:
        manager.load_plugins()
    return manager


