"""The Python API's input: :class:`LaunchConfig`, torch's fields over the capabilities' settings objects.

The command line does not pass through here: its flag groups (:mod:`launcher.flags`) read each
value once into their settings objects, and the plan is built from those
(:func:`launcher.plan.plan_from_settings`). :class:`LaunchConfig` keeps
``torch.distributed.launcher.api.LaunchConfig``'s flat fields for the Python API, checks them with
the same readers the flag groups use (:meth:`LaunchConfig.validate`, named after the flags), and
turns them into the same settings objects in one step (:meth:`LaunchConfig.to_settings`).
:func:`launcher.plan.build_plan` does both, then builds the plan as the command line does.

This module checks values only; the plugins a config names are resolved, and the machine
checked, when the plan is built. Every problem is a :class:`~launcher.errors.UsageError` with one
line that says what is wrong and what would be right. The readers of single values are named
here too, where the Python API has always found them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from launcher.agent.settings import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    MAX_MONITOR_INTERVAL,
    PreloadSettings,
    WorkerSettings,
    check_role,
    check_start_method,
    check_worker_tty,
    parse_preload,
    signal_numbers,
)
from launcher.devices.settings import NumaSettings, check_numa_fallback
from launcher.events.settings import EventSettings
from launcher.hangs.settings import HangSettings, hang_settings
from launcher.logs.settings import (
    STD_ALL,
    STD_ERR,
    STD_NONE,
    STD_OUT,
    LogSettings,
    StdSpec,
    check_ranks_filter,
    check_std,
    parse_filters,
    parse_ranks_filter,
    parse_std,
)
from launcher.rendezvous.settings import (
    DEFAULT_MASTER_PORT,
    RendezvousSettings,
    new_run_id,
    parse_nnodes,
    parse_rdzv_conf,
)
from launcher.values import MAX_NODES, MAX_NPROC, MAX_RESTARTS, parse_int, parse_seconds

# The readers of single values live in the settings module of the flags they read; they are
# named here too, where the Python API has always found them.
__all__ = [
    "DEFAULT_MASTER_PORT",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "MAX_MONITOR_INTERVAL",
    "STD_ALL",
    "STD_ERR",
    "STD_NONE",
    "STD_OUT",
    "LaunchConfig",
    "StdSpec",
    "check_std",
    "new_run_id",
    "parse_filters",
    "parse_nnodes",
    "parse_ranks_filter",
    "parse_rdzv_conf",
    "parse_std",
    "signal_numbers",
]


@dataclass
class LaunchConfig:
    """Everything the agent needs to run one node of a job.

    The fields and their defaults follow ``torch.distributed.launcher.api.LaunchConfig`` where one
    exists. ``rdzv_backend="c10d"`` with no endpoint and ``max_nodes=1`` runs a local, single-node
    rendezvous that needs no torch import (what ``--standalone`` does).
    """

    min_nodes: int = 1
    max_nodes: int = 1
    nproc_per_node: int = 1
    run_id: str = ""
    role: str = "default"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "c10d"
    rdzv_configs: dict[str, Any] = field(default_factory=dict)
    max_restarts: int = 0
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    log_dir: str | None = None
    redirects: StdSpec = STD_NONE
    tee: StdSpec = STD_NONE
    local_ranks_filter: set[int] | None = None
    duplicate_stdout_filters: list[str] = field(default_factory=list)
    duplicate_stderr_filters: list[str] = field(default_factory=list)
    #: A LogsSpecs plugin name, a LogsSpecs instance, or ``None`` for the default layout.
    logs_specs: Any = None
    #: Event sink names.
    event_log_handlers: list[str] = field(default_factory=lambda: ["null"])
    local_addr: str | None = None
    signals_to_handle: Sequence[str] = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    exit_barrier_timeout: float = 300.0
    virtual_local_rank: bool = False
    numa_binding: str | None = None
    numa_fallback: str = "warn"
    #: ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``; ``None`` gives ``[<role><local_rank>]:``.
    log_line_prefix_template: str | None = None
    #: Extra environment for every worker (the Python API's way to pass settings).
    worker_env: dict[str, str] = field(default_factory=dict)
    #: ``--worker-tty``: pseudo-terminals for workers: ``auto`` (when the launcher's console is a
    #: terminal), ``always`` or ``never`` (pipes, whole lines).
    worker_tty: str = "auto"
    #: Seconds without progress after which a rank is hung, or ``"auto"`` (learned; ``None``: no
    #: hang detection).
    hang_timeout: float | str | None = None
    #: What counts as progress: ``heartbeat`` (launcher.heartbeat() calls) or ``output`` (those or any line).
    hang_watch: str = "heartbeat"
    #: ``--hang-factor``, ``--hang-start-timeout``, ``--hang-floor``: with ``hang_timeout="auto"``
    #: only (``None``: the default).
    hang_factor: float | None = None
    hang_start_timeout: float | None = None
    hang_floor: float | None = None
    #: ``--preload``: modules a per-node template imports once, workers forked from it (launcher.preload.preload).
    preload: tuple[str, ...] = ()

    #: Every flag group's settings object by group name, a plugin's (``launcher_flag_groups``)
    #: included: the command line fills it; an API caller may pass a plugin's own.
    settings: dict[str, Any] = field(default_factory=dict)
    #: The typed settings of the capabilities whose fields are above, built by :meth:`validate`
    #: with the checks the command line's flag groups use.
    hangs: HangSettings = field(init=False, repr=False, compare=False)
    numa: NumaSettings = field(init=False, repr=False, compare=False)
    events: EventSettings = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.run_id:
            self.run_id = new_run_id()
        self.validate()

    def validate(self) -> None:
        """Check the fields that need no plugin; raise :class:`UsageError` on the first problem.

        Each value goes through the check of the flag group that reads it on the command line (its
        capability's settings module), numbers through :mod:`launcher.values`: ASCII, finite, in range.
        """
        self.min_nodes = parse_int(self.min_nodes, "LaunchConfig.min_nodes", 1, MAX_NODES)
        self.max_nodes = parse_int(self.max_nodes, "LaunchConfig.max_nodes", self.min_nodes, MAX_NODES)
        self.nproc_per_node = parse_int(self.nproc_per_node, "--nproc-per-node", 1, MAX_NPROC)
        self.max_restarts = parse_int(self.max_restarts, "--max-restarts", 0, MAX_RESTARTS)
        self.monitor_interval = parse_seconds(
            self.monitor_interval, "--monitor-interval", MAX_MONITOR_INTERVAL, zero=False
        )
        check_start_method(self.start_method)
        self.shutdown_timeout = parse_seconds(self.shutdown_timeout, "--shutdown-timeout")
        self.exit_barrier_timeout = parse_seconds(self.exit_barrier_timeout, "--exit-barrier-timeout")
        self.numa = NumaSettings(self.numa_binding, check_numa_fallback(self.numa_fallback))
        check_role(self.role)
        check_worker_tty(self.worker_tty)
        for spec, flag in ((self.redirects, "--redirects"), (self.tee, "--tee")):
            check_std(spec, flag, self.nproc_per_node)
        check_ranks_filter(self.local_ranks_filter, self.nproc_per_node)
        if isinstance(self.signals_to_handle, str):  # the command line's form, "SIGTERM,SIGINT"
            self.signals_to_handle = self.signals_to_handle.split(",")
        signal_numbers(self.signals_to_handle)
        self.hangs = hang_settings(self.hang_timeout, self.hang_watch, factor=self.hang_factor,
                                   start_timeout=self.hang_start_timeout, floor=self.hang_floor)
        self.hang_watch = self.hangs.watch
        if self.hangs.auto:
            self.hang_timeout, self.hang_factor = "auto", self.hangs.factor
            self.hang_start_timeout, self.hang_floor = self.hangs.timeout, self.hangs.floor
        else:
            self.hang_timeout = self.hangs.timeout
        self.preload = parse_preload(self.preload) if self.preload else ()
        self.events = EventSettings(tuple(self.event_log_handlers))

    # device_provider is a launcher.plugins.types.DeviceProvider; not imported, even for type
    # checkers: this module names no plugin machinery (tests/core/test_plan.py checks it).
    def to_settings(self, device_provider: Any = None) -> dict[str, Any]:
        """The settings objects these fields describe, by flag group name, as the flag groups give them.

        The fields must have been checked (:meth:`validate`, which the constructor runs); nothing
        is checked again. :attr:`settings` (a plugin's group, ``health``, ``metrics``...) comes
        along; the groups these fields describe replace any object of the same name in it. What
        only the command line has (the workers' command, ``--standalone``, ``--no-python``) is
        left empty: the API passes its entrypoint to the plan itself. A LogsSpecs instance in
        :attr:`logs_specs` is not a setting (the ``logs`` object names a plugin or none); the plan
        takes it separately. ``device_provider`` is the provider that counted the workers, if any.
        """
        core: dict[str, Any] = {
            "rendezvous": RendezvousSettings(
                min_nodes=self.min_nodes,
                max_nodes=self.max_nodes,
                backend=self.rdzv_backend,
                endpoint=self.rdzv_endpoint,
                run_id=self.run_id,
                # The backend receives text (RendezvousParameters), as the command line gives it.
                configs=MappingProxyType({str(k): str(v) for k, v in self.rdzv_configs.items()}),
                local_addr=self.local_addr,
            ),
            "workers": WorkerSettings(
                nproc_per_node=self.nproc_per_node,
                device_provider=device_provider,
                command=(),
                run_path=None,
                no_python=False,
                max_restarts=self.max_restarts,
                monitor_interval=self.monitor_interval,
                start_method=self.start_method,
                role=self.role,
                signals_to_handle=tuple(self.signals_to_handle),
                shutdown_timeout=self.shutdown_timeout,
                exit_barrier_timeout=self.exit_barrier_timeout,
                virtual_local_rank=bool(self.virtual_local_rank),
                worker_tty=self.worker_tty,
                signal_numbers=tuple(self.signal_numbers),
            ),
            "events": self.events,
            "logs": LogSettings(
                log_dir=self.log_dir,
                redirects=self.redirects,
                tee=self.tee,
                local_ranks_filter=None if self.local_ranks_filter is None else frozenset(self.local_ranks_filter),
                duplicate_stdout_filters=tuple(self.duplicate_stdout_filters),
                duplicate_stderr_filters=tuple(self.duplicate_stderr_filters),
                logs_specs=self.logs_specs if isinstance(self.logs_specs, str) else None,
            ),
            "numa": self.numa,
            "hangs": self.hangs,
            "preload": PreloadSettings(tuple(self.preload)),
        }
        settings = dict(self.settings)
        settings.update(core)  # in the settings' own order where they hold these groups already
        return settings

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], *, log_line_prefix_template: str | None = None
                      ) -> LaunchConfig:
        """The config the command line's settings objects describe (:func:`launcher.flags.read_groups`).

        The core's groups give the fields; every group's object (a plugin's too) is kept in
        :attr:`settings` under its name. The command line itself does not take this way (it
        builds its plan from the settings); it is for a caller that holds settings and wants the
        API's config, and :meth:`to_settings` gives them back (tests check the two agree).
        """
        rdzv: RendezvousSettings = settings["rendezvous"]
        workers: WorkerSettings = settings["workers"]
        logs: LogSettings = settings["logs"]
        numa: NumaSettings = settings["numa"]
        hangs: HangSettings = settings["hangs"]
        return cls(
            min_nodes=rdzv.min_nodes,
            max_nodes=rdzv.max_nodes,
            nproc_per_node=workers.nproc_per_node,
            run_id=rdzv.run_id,
            role=workers.role,
            rdzv_endpoint=rdzv.endpoint,
            rdzv_backend=rdzv.backend,
            rdzv_configs=dict(rdzv.configs),
            max_restarts=workers.max_restarts,
            monitor_interval=workers.monitor_interval,
            start_method=workers.start_method,
            log_dir=logs.log_dir,
            redirects=logs.redirects,
            tee=logs.tee,
            local_ranks_filter=None if logs.local_ranks_filter is None else set(logs.local_ranks_filter),
            duplicate_stdout_filters=list(logs.duplicate_stdout_filters),
            duplicate_stderr_filters=list(logs.duplicate_stderr_filters),
            logs_specs=logs.logs_specs,
            event_log_handlers=list(settings["events"].handlers),
            local_addr=rdzv.local_addr,
            signals_to_handle=list(workers.signals_to_handle),
            shutdown_timeout=workers.shutdown_timeout,
            exit_barrier_timeout=workers.exit_barrier_timeout,
            virtual_local_rank=workers.virtual_local_rank,
            numa_binding=numa.binding,
            numa_fallback=numa.fallback,
            log_line_prefix_template=log_line_prefix_template,
            worker_tty=workers.worker_tty,
            hang_timeout="auto" if hangs.auto else hangs.timeout,
            hang_watch=hangs.watch,
            hang_factor=hangs.factor if hangs.auto else None,
            hang_start_timeout=hangs.timeout if hangs.auto else None,
            hang_floor=hangs.floor if hangs.auto else None,
            preload=settings["preload"].modules,
            settings=dict(settings),
        )

    @property
    def signal_numbers(self) -> list[int]:
        """:attr:`signals_to_handle` as signal numbers."""
        return signal_numbers(self.signals_to_handle)
