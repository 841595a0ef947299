"""The launch plan: everything a launch needs, decided once, before anything starts.

::

    command line ─► read_groups() ─► settings ─► plan_from_settings() ─► LaunchPlan ─► Agent(plan).run()
    LaunchConfig ─► validate(), to_settings() ─┘        │
                    (build_plan)                        │
                     ├─ every plugin the settings name: rendezvous backend (and its --rdzv-conf),
                     │  LogsSpecs, event handlers, NUMA strategy
                     ├─ the machine: --log-dir writable, ulimit room for the workers
                     └─ decisions: the LogsSpecs object, the NUMA CPU plan, the workers' base
                        environment (OMP_NUM_THREADS), --virtual-local-rank's devices, hang settings

:func:`plan_from_settings` (and :func:`build_plan`) raises every problem it finds as a
:class:`~launcher.errors.UsageError` (one line, exit status 2; NUMA's ``--numa-fallback error``
as a :class:`~launcher.errors.LaunchError`) before a store is served, a node contacted or a
worker started. It reads every value from the flag groups' settings objects
(``settings["rendezvous"]``, ``["workers"]``, ``["logs"]``...), each already checked by the group
that made it, and checks again only what needs a plugin or the machine. The CLI and the Python
API both build the plan this way (the API through :func:`build_plan`, which turns a
:class:`~launcher.config.LaunchConfig` into those objects first), so both print the same notices
and reject the same input.

A plan holds no resources. What would be one is a factory the agent calls and then owns:
:meth:`RendezvousPlan.create_handler` (creating a handler may connect to a store) and
:meth:`EventsPlan.open` (sinks may open files and start threads).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from launcher.errors import UsageError
from launcher.values import quote

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.group import Entrypoint
    from launcher.agent.settings import WorkerSettings
    from launcher.config import LaunchConfig
    from launcher.devices.settings import NumaSettings
    from launcher.events.bus import EventBus
    from launcher.events.model import SinkContext
    from launcher.events.settings import EventSettings
    from launcher.hangs.settings import HangSettings
    from launcher.health.plan import HealthPlan
    from launcher.logs.settings import LogSettings
    from launcher.plugins.manager import LauncherPluginManager
    from launcher.plugins.types import DeviceProvider, EventHandler, LogsSpecsLike, RendezvousBackend
    from launcher.preemption.settings import PreemptionPlan
    from launcher.rendezvous.api import RendezvousHandler, RendezvousParameters
    from launcher.rendezvous.settings import RendezvousSettings
    from launcher.topology.api import NodeLocation

__all__ = [
    "EventsPlan",
    "HangPlan",
    "LaunchPlan",
    "RendezvousPlan",
    "WorkerPlan",
    "build_plan",
    "check_log_dir",
    "format_cpus",
    "plan_from_settings",
    "resolve_plugins",
]

log = logging.getLogger("launcher.plan")

#: CPU sets per local rank (``None``: that rank runs unbound), or ``None`` without ``--numa-binding``.
CpuPlan = tuple[frozenset[int] | None, ...] | None


@dataclass(frozen=True)
class RendezvousPlan:
    """The rendezvous backend and its parameters, checked but not connected."""

    backend: RendezvousBackend
    parameters: RendezvousParameters

    def create_handler(self) -> RendezvousHandler:
        """A new handler of the backend (it may connect to, or serve, a store)."""
        from launcher.rendezvous.registry import handler_for

        return handler_for(self.backend, self.parameters)

    def setting(self, key: str) -> str | None:
        """An ``--rdzv-conf`` value, as the backend receives it."""
        return self.parameters.config.get(key)


@dataclass(frozen=True)
class EventsPlan:
    """The event handlers chosen with ``--event-log-handler`` and what their sinks are told."""

    handlers: tuple[EventHandler, ...]
    context: SinkContext
    _open: Callable[[], EventBus] = field(repr=False, compare=False)

    def open(self) -> EventBus:
        """Start every handler's sink; a sink that cannot start raises a :class:`UsageError`."""
        return self._open()


@dataclass(frozen=True)
class HangPlan:
    """``--hang-timeout`` and ``--hang-watch``."""

    timeout: float
    #: Whether any output line counts as progress (``--hang-watch output``), not only heartbeats.
    watch_output: bool


@dataclass(frozen=True)
class WorkerPlan:
    """How every worker of every attempt is started."""

    start_method: str
    worker_tty: str
    #: ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``; ``None`` gives ``[<role><local_rank>]:``.
    prefix_template: str | None
    stdout_filters: tuple[str, ...]
    stderr_filters: tuple[str, ...]
    #: The agent's environment with the plan's decisions applied (``OMP_NUM_THREADS``).
    base_env: Mapping[str, str] = field(repr=False)
    #: Set for every worker on top of ``base_env`` (``LaunchConfig.worker_env``).
    extra_env: Mapping[str, str]
    #: Per local rank, ``--virtual-local-rank``'s overrides (empty mappings without it).
    device_env: tuple[Mapping[str, str], ...]
    cpus: CpuPlan
    #: ``--preload``: modules the workers are forked with, already imported (launcher.preload.preload).
    preload: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchPlan:
    """One node's launch, fully decided: what :class:`~launcher.agent.agent.Agent` runs."""

    run_id: str
    role: str
    #: This host's name, as reports and events name the node.
    node: str
    entry: Entrypoint
    nproc_per_node: int
    max_restarts: int
    monitor_interval: float
    shutdown_timeout: float
    exit_barrier_timeout: float
    #: ``--local-addr``: how other nodes reach this one (``None``: the backend's guess).
    local_addr: str | None
    #: Signals the agent forwards to its workers.
    signals: tuple[int, ...]
    #: ``--signals-to-handle`` as given (workers see it as ``TORCHELASTIC_SIGNALS_TO_HANDLE``).
    signal_names: tuple[str, ...]
    rendezvous: RendezvousPlan
    workers: WorkerPlan
    #: The LogsSpecs object that places each attempt's output (launcher's, or one for torchrun).
    logs_specs: LogsSpecsLike
    log_dir: str | None
    events: EventsPlan
    hangs: HangPlan | None
    device_provider: DeviceProvider | None
    #: The health checks before each round (launcher.health); ``None``: ``--health-checks none``.
    health: HealthPlan | None = None
    #: Every flag group's settings object by group name, a plugin's included (read-only).
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: ``--metrics-port`` (launcher.status.metrics): checked free by the config, served once the workers run.
    metrics_port: int | None = None
    #: ``--preemption-signals``/``--preemption-grace`` (launcher.preemption); ``None``: off.
    preemption: PreemptionPlan | None = None
    #: ``--topology``: where this node sits (launcher.topology), found when the plan is built;
    #: ``None``: off (torchrun's order), or ``auto`` found nothing.
    topology: NodeLocation | None = None
    #: ``--segment N``: N (only whole segments of N nodes of one domain train); ``None``: off.
    segment: int | None = None


def build_plan(
    config: LaunchConfig,
    manager: LauncherPluginManager,
    entry: Entrypoint,
    *,
    device_provider: DeviceProvider | None = None,
) -> LaunchPlan:
    """The plan for the Python API's ``config``: its fields checked, then :func:`plan_from_settings`.

    ``device_provider`` is the provider that counted ``nproc_per_node``, if any. Raises
    :class:`UsageError` for any problem, before anything starts.
    """
    config.validate()  # a LaunchConfig may have been changed since it was built
    instance = None if isinstance(config.logs_specs, str) else config.logs_specs
    return plan_from_settings(config.to_settings(device_provider), manager, entry,
                              prefix_template=config.log_line_prefix_template,
                              worker_env=config.worker_env, logs_specs=instance)


def plan_from_settings(
    settings: Mapping[str, Any],
    manager: LauncherPluginManager,
    entry: Entrypoint,
    *,
    prefix_template: str | None = None,
    worker_env: Mapping[str, str] | None = None,
    logs_specs: LogsSpecsLike | None = None,
) -> LaunchPlan:
    """The plan for the flag groups' settings objects (:func:`launcher.flags.read_groups`).

    ``settings`` holds every group's object by name (the core's and the plugins'); what is not a
    flag comes beside it: ``prefix_template`` (``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``),
    ``worker_env`` (the API's extra environment) and ``logs_specs`` (a LogsSpecs instance that
    replaces ``--logs-specs``). The values are not checked again (their groups did); every plugin
    they name is resolved and the machine checked. Raises :class:`UsageError`, before anything starts.
    """
    rdzv: RendezvousSettings = settings["rendezvous"]
    workers: WorkerSettings = settings["workers"]
    logs: LogSettings = settings["logs"]
    numa: NumaSettings = settings["numa"]
    hangs: HangSettings = settings["hangs"]
    backend, event_handlers = resolve_plugins(settings, manager)
    location = None
    if settings.get("topology") is not None:  # imported only with --topology: a plain start is unchanged
        from launcher.topology.locate import locate_node

        location = locate_node(settings["topology"], manager, rdzv.local_addr)
        if settings["topology"].segment is not None:
            from launcher.topology.locate import check_segment

            check_segment(settings["topology"], rdzv.min_nodes, rdzv.max_nodes, rdzv.backend, location,
                          core_rounds=backend.name == "c10d" or backend.create_store is not None)
    if logs.log_dir:
        check_log_dir(logs.log_dir)
    from launcher.limits import check_worker_limits

    check_worker_limits(workers.nproc_per_node)

    from launcher.rendezvous.registry import parameters_for

    if logs_specs is None:
        from launcher.logs.select import create_logs_specs

        logs_specs = create_logs_specs(logs, manager)
    provider = workers.device_provider
    cpus = _plan_cpus(numa, workers.nproc_per_node, provider, manager)
    base_env = _base_env(workers.nproc_per_node)
    node = socket.gethostname()
    preemption = None
    preemption_settings = settings.get("preemption")  # --preemption-*, --requeue
    if preemption_settings is not None and preemption_settings.enabled:
        from launcher.preemption.settings import plan_for

        preemption = plan_for(preemption_settings, workers.shutdown_timeout)
    frozen = MappingProxyType(dict(settings))
    preload = tuple(settings["preload"].modules)
    if preload and workers.no_python:
        log.warning("%s does not apply with --no-python (the program is not started by Python): "
                    "starting workers normally", settings["preload"].source)
        preload = ()
    return LaunchPlan(
        run_id=rdzv.run_id,
        role=workers.role,
        node=node,
        entry=entry,
        nproc_per_node=workers.nproc_per_node,
        max_restarts=workers.max_restarts,
        monitor_interval=workers.monitor_interval,
        shutdown_timeout=workers.shutdown_timeout,
        exit_barrier_timeout=workers.exit_barrier_timeout,
        local_addr=rdzv.local_addr,
        # The preemption signals are caught too, whether or not --signals-to-handle names them.
        signals=tuple(dict.fromkeys([*workers.signal_numbers, *(preemption.signals if preemption else ())])),
        signal_names=tuple(s.strip() for s in workers.signals_to_handle),
        rendezvous=RendezvousPlan(backend, parameters_for(rdzv)),
        workers=WorkerPlan(
            start_method=workers.start_method,
            worker_tty=workers.worker_tty,
            prefix_template=prefix_template,
            stdout_filters=tuple(logs.duplicate_stdout_filters),
            stderr_filters=tuple(logs.duplicate_stderr_filters),
            base_env=MappingProxyType(base_env),
            extra_env=MappingProxyType(dict(worker_env or {})),
            device_env=_device_env(workers, base_env),
            cpus=cpus,
            preload=preload,
        ),
        logs_specs=logs_specs,
        log_dir=logs.log_dir,
        events=_events_plan(settings["events"], rdzv.run_id, workers.role, frozen, manager, node, event_handlers),
        hangs=HangPlan(hangs.timeout, hangs.watch_output) if hangs.timeout else None,
        device_provider=provider,
        settings=frozen,
        health=_health_plan(settings, manager, entry, base_env, node, logs.log_dir, preload, workers),
        metrics_port=_metrics_port(settings),
        preemption=preemption,
        topology=location,
        segment=settings["topology"].segment if settings.get("topology") is not None else None,
    )


def _metrics_port(settings: Mapping[str, Any]) -> int | None:
    """``settings["metrics"]`` (``--metrics-port``, or the API's
    :func:`~launcher.status.settings.metrics_settings`): the port, ``None`` when off."""
    metrics = settings.get("metrics")
    return metrics.port if metrics is not None else None


def _health_plan(settings: Mapping[str, Any], manager: LauncherPluginManager, entry: Entrypoint,
                 base_env: Mapping[str, str], node: str, log_dir: str | None, preload: tuple[str, ...],
                 workers: WorkerSettings) -> HealthPlan | None:
    """The checks before each round: ``settings["health"]`` (the flags, or the API's
    :func:`~launcher.health.settings.health_settings`), else the default checks."""
    from launcher.health.plan import build_health_plan
    from launcher.health.settings import HealthSettings

    health = settings.get("health") or HealthSettings()
    return build_health_plan(health, manager, node=node, entry=entry, env=base_env,
                             log_dir=log_dir, preload=preload,
                             nproc_per_node=workers.nproc_per_node, device_provider=workers.device_provider)


def resolve_plugins(
    settings: Mapping[str, Any], manager: LauncherPluginManager
) -> tuple[RendezvousBackend, tuple[EventHandler, ...]]:
    """Every plugin the settings name exists (and the rendezvous backend accepts its settings).

    Returns the rendezvous backend and the event handlers (each once, aliases collapsed); the
    LogsSpecs and the NUMA strategy are only checked here, and built by their own steps.
    """
    from launcher.plugins.types import EventHandler, LogsSpecsProvider, NumaStrategy
    from launcher.rendezvous.registry import check_rendezvous_settings

    backend = check_rendezvous_settings(settings["rendezvous"], manager)
    logs_specs = settings["logs"].logs_specs
    if isinstance(logs_specs, str):
        manager.get(LogsSpecsProvider, logs_specs)
    handlers: dict[str, EventHandler] = {}
    for name in settings["events"].handlers:
        handler = manager.get(EventHandler, name)
        handlers.setdefault(handler.name, handler)
    binding = settings["numa"].binding
    if binding:
        manager.get(NumaStrategy, binding)
    return backend, tuple(handlers.values())


def check_log_dir(path: str) -> None:
    """``path`` exists as a writable directory afterwards (created if missing), or a one-line error.

    Creating it is what the logs would do a moment later; doing it now turns a traceback in the
    middle of the start into a usage error before it.
    """
    if path == os.devnull:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--log-dir {quote(path)} is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"--log-dir {quote(path)} cannot be created or written: {reason}") from None


def _events_plan(events: EventSettings, run_id: str, role: str, settings: Mapping[str, Any],
                 manager: LauncherPluginManager, node: str, handlers: tuple[EventHandler, ...]) -> EventsPlan:
    from launcher.events.bus import create_event_bus
    from launcher.events.model import SinkContext

    context = SinkContext(run_id=run_id, node=node, role=role, settings=settings)
    names = events.handlers
    return EventsPlan(handlers, context, functools.partial(create_event_bus, names, manager, context))


def _plan_cpus(numa: NumaSettings, nproc: int, provider: DeviceProvider | None,
               manager: LauncherPluginManager) -> CpuPlan:
    if not numa.binding:
        return None
    from launcher.numa import plan_affinity

    plan = plan_affinity(
        numa.binding,
        nproc,
        provider,
        manager,
        on_failure="error" if numa.fallback == "error" else "warn",
    )
    if plan is None:
        return None
    for rank, cpus in enumerate(plan):
        log.info("local rank %d bound to CPUs %s", rank, format_cpus(cpus))
    return tuple(plan)


def _base_env(nproc: int) -> dict[str, str]:
    """This process's environment, with ``OMP_NUM_THREADS=1`` when several workers would share the CPUs."""
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env and nproc > 1:
        log.warning(
            "setting OMP_NUM_THREADS=1 for each worker so %d workers do not oversubscribe the CPUs; "
            "set OMP_NUM_THREADS to tune it",
            nproc,
        )
        env["OMP_NUM_THREADS"] = "1"
    return env


def _device_env(workers: WorkerSettings, base_env: Mapping[str, str]) -> tuple[Mapping[str, str], ...]:
    """``--virtual-local-rank``: each local rank's one device (a rank without one is a UsageError)."""
    if not workers.virtual_local_rank:
        return tuple(MappingProxyType({}) for _ in range(workers.nproc_per_node))
    from launcher.devices import virtual_local_rank_env

    return tuple(
        MappingProxyType(virtual_local_rank_env(workers.device_provider, local_rank, base_env))
        for local_rank in range(workers.nproc_per_node)
    )


def format_cpus(cpus: frozenset[int] | None) -> str:
    """``0-3,8`` for the CPUs ``{0, 1, 2, 3, 8}`` (empty for none)."""
    if not cpus:
        return ""
    ordered = sorted(cpus)
    parts = []
    start = prev = ordered[0]
    for cpu in [*ordered[1:], -2]:
        if cpu != prev + 1:
            parts.append(f"{start}-{prev}" if start != prev else str(start))
            start = cpu
        prev = cpu
    return ",".join(parts)
