"""Typed registration objects that plugin hooks return.

Every hook of :mod:`launcher.plugins.hookspec` yields instances of one of these classes. A
registration is cheap to build: it carries a name, a one-line description and *callables* that
do the real work later, so collecting every registration (for ``launcher plugins`` or for
``--help``) never imports torch or a plugin's heavy dependencies.

Each class is also the key of its kind: it names the hook that yields it (:attr:`Registration.hook`)
and the words messages use for it (:attr:`Registration.kind`), and the plugin manager looks
registrations up by class (``manager.get(RendezvousBackend, "c10d")``), typed by that class.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from launcher.clusters.api import ClusterInfo
    from launcher.events.model import EventSink, SinkContext
    from launcher.health.api import CheckContext, CheckResult
    from launcher.numa.strategies import AffinityStrategy
    from launcher.rendezvous.api import RendezvousHandler, RendezvousParameters
    from launcher.store.api import KeyValueStore
    from launcher.topology.api import NodeLocation, TopologyQuery

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


@dataclass(frozen=True)
class Registration:
    """Fields every kind of registration shares.

    ``name`` is what users type (``--rdzv-backend NAME``); it is normalised to lower case and must
    match ``[a-z0-9][a-z0-9_.-]*``. ``aliases`` are further names for the same thing (``gpu`` for
    ``cuda``). ``description`` is one line shown by ``launcher plugins``.

    Each kind's class sets two class variables: :attr:`kind`, the words users read in messages
    ("unknown rendezvous backend 'x'"), and :attr:`hook`, the hook that yields it.
    """

    #: What messages and ``launcher plugins`` call this kind ("rendezvous backend").
    kind: ClassVar[str] = "registration"
    #: The hook of :class:`~launcher.plugins.hookspec.LauncherSpecs` that yields this kind.
    hook: ClassVar[str] = ""

    name: str
    description: str = ""
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        normalised = _normalise(self.name, self.kind)
        object.__setattr__(self, "name", normalised)
        object.__setattr__(self, "aliases", tuple(_normalise(a, self.kind) for a in self.aliases))

    @property
    def names(self) -> tuple[str, ...]:
        """The name followed by every alias."""
        return (self.name, *self.aliases)


def _normalise(name: str, kind: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a string, got {type(name).__name__}")
    value = name.strip().lower()
    if not _NAME.match(value):
        raise ValueError(
            f"invalid {kind} name {name!r}: use lower-case letters, digits, '-', '_' or '.', "
            "starting with a letter or digit"
        )
    return value


@dataclass(frozen=True)
class RendezvousBackend(Registration):
    """A rendezvous backend (``--rdzv-backend NAME``).

    Provide ``create_store`` when the backend is only a key-value store: the core runs its own
    rendezvous algorithm over it. Provide ``create_handler`` to replace the whole rendezvous.
    Exactly one of the two must be given. Both receive the parsed
    :class:`~launcher.rendezvous.api.RendezvousParameters`.
    """

    kind: ClassVar[str] = "rendezvous backend"
    hook: ClassVar[str] = "launcher_rendezvous_backends"

    create_handler: Callable[[RendezvousParameters], RendezvousHandler] | None = field(
        default=None, kw_only=True
    )
    create_store: Callable[[RendezvousParameters], KeyValueStore] | None = field(default=None, kw_only=True)
    #: ``--rdzv-conf`` keys this backend understands beyond the core's own; ``None`` accepts any.
    config_keys: frozenset[str] | None = field(default=None, kw_only=True)
    #: Optional: checks the endpoint and every ``--rdzv-conf`` value before anything starts,
    #: raising :class:`~launcher.rendezvous.api.RendezvousConfigError` (one line, exit status 2).
    #: It must be cheap and must not connect anywhere. Without it, a store-only backend's values
    #: are checked as the core's rendezvous reads them.
    check_parameters: Callable[[RendezvousParameters], None] | None = field(default=None, kw_only=True)
    #: Optional: a store that only reads the rendezvous's keys, for ``launcher status
    #: --rdzv-endpoint`` from any host: with the job's credentials, it must not serve, join, take
    #: a lease or write anything, and must fail with one line (a :class:`RendezvousError`) when
    #: the store cannot be reached or refuses it. Without it, status through this backend is refused.
    read_store: Callable[[RendezvousParameters], KeyValueStore] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.create_handler is None) == (self.create_store is None):
            raise ValueError(
                f"rendezvous backend {self.name!r} must give exactly one of create_handler or create_store"
            )


class LogsDestinations(Protocol):
    """What the agent reads of the ``LogsDest`` a LogsSpecs' ``reify`` returns.

    Launcher's :class:`~launcher.logs.specs.LogsDest` and torch's ``LogsDest`` both have it. Each
    mapping is keyed by local rank; see :mod:`launcher.logs.specs` for what the values mean.
    """

    @property
    def stdouts(self) -> Mapping[int, str]: ...
    @property
    def stderrs(self) -> Mapping[int, str]: ...
    @property
    def tee_stdouts(self) -> Mapping[int, str]: ...
    @property
    def tee_stderrs(self) -> Mapping[int, str]: ...
    @property
    def error_files(self) -> Mapping[int, str]: ...
    @property
    def filtered_stdout(self) -> str: ...
    @property
    def filtered_stderr(self) -> str: ...


class LogsSpecsLike(Protocol):
    """What launcher uses of a LogsSpecs: torch's ``LogsSpecs`` API, which launcher's own follows.

    A LogsSpecs may also have the optional members of :class:`FinishingLogsSpecs` and
    :class:`RunLogDirLogsSpecs`; the agent reaches them only through :func:`finish_logs` and
    :func:`run_log_dir`.
    """

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDestinations:
        """Destinations for one attempt; may set ``TORCHELASTIC_ERROR_FILE`` in ``envs``."""
        ...

    @property
    def root_log_dir(self) -> str:
        """The base directory of this job's logs."""
        ...


# The optional members are protocols of their own, not part of LogsSpecsLike: before Python 3.12 a
# runtime check of LogsSpecsLike would read root_log_dir, which creates the default one's temporary
# directory.
@runtime_checkable
class FinishingLogsSpecs(Protocol):
    """A LogsSpecs told when the job ends (launcher extension; torch's LogsSpecs lack it)."""

    def finish(self, succeeded: bool) -> None:
        """Called once when the job ends."""
        ...


@runtime_checkable
class RunLogDirLogsSpecs(Protocol):
    """A LogsSpecs that names this job's own directory (launcher extension)."""

    @property
    def run_log_dir(self) -> str | None:
        """This job's directory, once the first attempt created it."""
        ...


def finish_logs(specs: LogsSpecsLike, succeeded: bool) -> None:
    """Tell ``specs`` that the job ended, if it has :meth:`FinishingLogsSpecs.finish`."""
    if isinstance(specs, FinishingLogsSpecs):
        specs.finish(succeeded)


def run_log_dir(specs: LogsSpecsLike) -> str | None:
    """``specs``' :attr:`RunLogDirLogsSpecs.run_log_dir`; ``None`` for a LogsSpecs without one."""
    return specs.run_log_dir if isinstance(specs, RunLogDirLogsSpecs) else None


@dataclass(frozen=True)
class LogsSpecsProvider(Registration):
    """A LogsSpecs: where worker output goes (``--logs-specs NAME``).

    ``load_class`` returns the LogsSpecs class; it is called only when the name is chosen, so the
    class's module (which may import torch, as torchrun's LogsSpecs do) is imported only then.
    The class is constructed with torchrun's keyword arguments ``log_dir``, ``redirects``, ``tee``
    and ``local_ranks_filter``.
    """

    kind: ClassVar[str] = "logs specs"
    hook: ClassVar[str] = "launcher_logs_specs"

    load_class: Callable[[], type[LogsSpecsLike]] = field(kw_only=True)


@dataclass(frozen=True)
class EventHandler(Registration):
    """An event sink (``--event-log-handler NAME[,NAME...]``).

    ``create_sink`` is called once per agent with the settings of ``launcher.events``
    (:class:`~launcher.events.model.SinkContext`) and returns an object with ``emit(event)`` and
    ``close()``.
    """

    kind: ClassVar[str] = "event handler"
    hook: ClassVar[str] = "launcher_event_handlers"

    create_sink: Callable[[SinkContext], EventSink] = field(kw_only=True)


@dataclass(frozen=True)
class NumaStrategy(Registration):
    """A NUMA affinity strategy (``--numa-binding NAME``).

    ``create`` returns the strategy object, an
    :class:`~launcher.numa.strategies.AffinityStrategy`: its ``cpus_for_workers(topology, devices,
    nproc)`` returns one set of CPU numbers per local rank.
    """

    kind: ClassVar[str] = "numa strategy"
    hook: ClassVar[str] = "launcher_numa_strategies"

    create: Callable[[], AffinityStrategy] = field(kw_only=True)


@dataclass(frozen=True)
class DeviceProvider(Registration):
    """A device-count provider (``--nproc-per-node NAME``).

    ``count_devices`` returns how many devices of this kind the node may use (0 when none); it may
    raise when the kind cannot be counted at all (its library is missing), and the message then
    reaches the user. ``visible_devices_env`` names the variable that restricts a worker to some
    devices (``CUDA_VISIBLE_DEVICES``), used by ``--virtual-local-rank``; ``None`` if there is none.
    ``accelerator`` says whether ``auto`` may pick it, and ``priority`` orders the accelerators
    ``auto`` tries (lowest first; the built-ins use 10 to 30, so the default 100 comes after them).

    Optional fields:

    ``pci_bus_ids``
        PCI bus ids (``0000:1b:00.0``) of the visible devices, in visible order, ``None`` for a
        device without one; NUMA strategies use them to find each device's node.
    ``answers_to``
        for a provider whose name is only known at run time (torch's privateuse1 backend):
        called with a name that no registration claims, returns whether this provider is meant.
        It may do expensive work (import torch); it is only called on that miss path.
    ``choose``
        for a provider that stands for another (``auto``): called with every registered
        provider, returns the one to count with. ``count_devices`` must still work on its own.
    """

    kind: ClassVar[str] = "device provider"
    hook: ClassVar[str] = "launcher_device_providers"

    count_devices: Callable[[], int] = field(kw_only=True)
    visible_devices_env: str | None = field(default=None, kw_only=True)
    accelerator: bool = field(default=True, kw_only=True)
    priority: int = field(default=100, kw_only=True)
    #: Optional: PCI bus ids of the visible devices, in visible order (for NUMA affinity).
    pci_bus_ids: Callable[[], list[str | None] | list[str]] | None = field(default=None, kw_only=True)
    #: Optional: whether a name no registration claims means this provider.
    answers_to: Callable[[str], bool] | None = field(default=None, kw_only=True)
    #: Optional: pick the provider to use among all registered ones (``auto``).
    choose: Callable[[list[DeviceProvider]], DeviceProvider] | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class ClusterEnvironment(Registration):
    """A scheduler whose environment describes the job (``--cluster NAME``; ``auto`` tries them all).

    ``detect`` is called with the process environment (a mapping it must not change) and
    returns a :class:`~launcher.clusters.api.ClusterInfo` when the environment is this
    scheduler's, ``None`` otherwise. It runs on every launch that does not say ``--cluster none``,
    so it must be quick and import nothing heavy. Every node of one job must derive the same
    node count, endpoint and run id from its own environment, and a distinct node rank.
    ``priority`` orders the environments ``auto`` tries (lowest first; the built-ins use 10 to
    40: MPI before Slurm, since an MPI rank inside Slurm sees both). ``variables`` names the
    variables that mark the scheduler, for messages and ``launcher plugins``.
    """

    kind: ClassVar[str] = "cluster environment"
    hook: ClassVar[str] = "launcher_cluster_environments"

    detect: Callable[[Mapping[str, str]], ClusterInfo | None] = field(kw_only=True)
    priority: int = field(default=100, kw_only=True)
    variables: tuple[str, ...] = field(default=(), kw_only=True)


@dataclass(frozen=True)
class HealthCheck(Registration):
    """A health check (``--health-checks NAME[,NAME...]``), run before each round the node joins.

    ``check`` is called with a :class:`~launcher.health.api.CheckContext` and returns
    :func:`~launcher.health.api.healthy`, :func:`~launcher.health.api.sick` (one-line reason: the
    node does not join) or :func:`~launcher.health.api.skipped` (one-line note: the check does not
    apply here). It runs in a thread of its own, beside the other checks, and must answer within
    ``time_limit`` seconds: one that overruns or raises is reported sick, naming it. A check that
    runs a process should use :func:`launcher.health.runner.run_process` (its process group is
    killed at the limit). ``default`` says whether it runs when ``--health-checks`` is not given;
    a default check must be cheap on a healthy node (it delays every start) and skip itself where
    it does not apply.
    """

    kind: ClassVar[str] = "health check"
    hook: ClassVar[str] = "launcher_health_checks"

    check: Callable[[CheckContext], CheckResult] = field(kw_only=True)
    time_limit: float = field(default=10.0, kw_only=True)
    default: bool = field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.time_limit, (int, float)) and 0 < self.time_limit <= 3600):
            raise ValueError(f"health check {self.name!r}: time_limit must be seconds in (0, 3600]")


@dataclass(frozen=True)
class TopologySource(Registration):
    """Where a node sits in the network (``--topology NAME[,NAME...]``; ``auto`` tries some).

    ``locate`` is called once when the agent starts, on the node itself, with a
    :class:`~launcher.topology.api.TopologyQuery` (the node's address and host names, the
    environment, the text after ``NAME:``), and returns a
    :class:`~launcher.topology.api.NodeLocation`: a path from the top of the network down (NVLink
    domain innermost) and, optionally, the node's order inside its innermost domain. It raises
    :class:`~launcher.topology.api.NoLocation` (one line: why) when it has no path for this
    node, and :class:`~launcher.errors.UsageError` when its argument is wrong (an unreadable
    file). It must not create a CUDA context or import torch. ``takes_argument``: the name must
    be written ``NAME:ARGUMENT`` (``file:PATH``); ``auto``: ``--topology auto`` asks this source,
    whose paths are then put together in ``priority`` order (lowest, the outermost, first: the
    built-ins use 20 for ``slurm`` and 90 for ``nvml``).
    """

    kind: ClassVar[str] = "topology source"
    hook: ClassVar[str] = "launcher_topology_sources"

    locate: Callable[[TopologyQuery], NodeLocation] = field(kw_only=True)
    takes_argument: bool = field(default=False, kw_only=True)
    auto: bool = field(default=False, kw_only=True)
    priority: int = field(default=100, kw_only=True)


#: Every kind of registration, in the order listings show them. The classes themselves are the
#: kinds: there is no table of kind names to keep in step with them.
REGISTRATION_CLASSES: tuple[type[Registration], ...] = (
    RendezvousBackend,
    LogsSpecsProvider,
    EventHandler,
    NumaStrategy,
    DeviceProvider,
    ClusterEnvironment,
    HealthCheck,
    TopologySource,
)
