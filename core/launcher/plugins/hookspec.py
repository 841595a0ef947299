"""Hook specifications: the eight kinds of plugin launcher accepts, and the plugins' own flags.

A plugin is any module or object with functions decorated by :data:`launcher.plugins.hookimpl`
and named after one of the hooks below. It is found through the ``launcher`` entry-point group::

    # pyproject.toml of your distribution
    [project.entry-points.launcher]
    my-plugin = "my_package.launcher_plugin"

Each hook yields registration objects (:mod:`launcher.plugins.types`); each registration class
names its hook (``RendezvousBackend.hook``). The core's own plugins are registered by the core
itself (:data:`launcher.plugins.manager.BUILTIN_PLUGINS`), not through entry points.

Hooks are called through pluggy, so ``tryfirst``/``trylast`` and wrappers (``wrapper=True`` or
``hookwrapper=True``) work as pluggy documents them. A hook's result is a list with one list of
registrations per implementation; a wrapper may change it (drop, replace or add registrations),
and may also put single registrations in it. Selection by name happens after every plugin's
registrations are collected, so two plugins offering the same name is an error rather than a
silent override. A hook implementation whose name matches no hook below is an error too (it is
most likely misspelled), reported when the plugins are loaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pluggy

from launcher.plugins.types import (
    ClusterEnvironment,
    DeviceProvider,
    EventHandler,
    HealthCheck,
    LogsSpecsProvider,
    NumaStrategy,
    RendezvousBackend,
    TopologySource,
)

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from launcher.flags import FlagGroup

PROJECT = "launcher"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class LauncherSpecs:
    """The hook specifications (one method per kind of plugin)."""

    @hookspec
    def launcher_rendezvous_backends(self) -> Iterable[RendezvousBackend]:  # type: ignore[empty-body]
        """Register rendezvous backends (``--rdzv-backend NAME``).

        A backend that provides a key-value store gets the core's rendezvous algorithm for free::

            from launcher.plugins import hookimpl
            from launcher.plugins.types import RendezvousBackend

            def _create_store(params):
                from my_package.store import RedisStore  # heavy import: only when used

                return RedisStore(params.endpoint, prefix=params.run_id)

            @hookimpl
            def launcher_rendezvous_backends():
                yield RendezvousBackend(
                    name="redis",
                    description="Rendezvous through a Redis server",
                    create_store=_create_store,
                )
        """

    @hookspec
    def launcher_logs_specs(self) -> Iterable[LogsSpecsProvider]:  # type: ignore[empty-body]
        """Register LogsSpecs (``--logs-specs NAME``): where worker output goes.

        Example, a layout that keeps only stderr, under ``--log-dir``::

            from launcher.plugins import hookimpl
            from launcher.plugins.types import LogsSpecsProvider

            def _load():
                from launcher.logs.specs import DefaultLogsSpecs

                class StderrOnly(DefaultLogsSpecs):
                    def __init__(self, **kwargs):
                        kwargs["redirects"] = 2
                        super().__init__(**kwargs)

                return StderrOnly

            @hookimpl
            def launcher_logs_specs():
                yield LogsSpecsProvider(name="stderr-only", load_class=_load,
                                        description="Only stderr, to files")
        """

    @hookspec
    def launcher_event_handlers(self) -> Iterable[EventHandler]:  # type: ignore[empty-body]
        """Register event sinks (``--event-log-handler NAME``).

        Example, a sink that appends each event's type to a file::

            from launcher.plugins import hookimpl
            from launcher.plugins.types import EventHandler

            class TypeLogger:
                def __init__(self, path):
                    self._file = open(path, "a")

                def emit(self, event):
                    self._file.write(event.type + "\\n")

                def close(self):
                    self._file.close()

            @hookimpl
            def launcher_event_handlers():
                yield EventHandler(name="types", description="Event types to ./events.txt",
                                   create_sink=lambda context: TypeLogger("events.txt"))
        """

    @hookspec
    def launcher_numa_strategies(self) -> Iterable[NumaStrategy]:  # type: ignore[empty-body]
        """Register NUMA affinity strategies (``--numa-binding NAME``).

        Example, every worker on the CPUs of NUMA node 0::

            from launcher.plugins import hookimpl
            from launcher.plugins.types import NumaStrategy

            class FirstNode:
                def cpus_for_workers(self, topology, devices, nproc):
                    cpus = topology.nodes[0].cpus
                    return [set(cpus) for _ in range(nproc)]

            @hookimpl
            def launcher_numa_strategies():
                yield NumaStrategy(name="first-node", description="All workers on node 0",
                                   create=FirstNode)
        """

    @hookspec
    def launcher_device_providers(self) -> Iterable[DeviceProvider]:  # type: ignore[empty-body]
        """Register device-count providers (``--nproc-per-node NAME``).

        Example, a provider for an accelerator whose devices appear as ``/dev/npu<N>``::

            import glob

            from launcher.plugins import hookimpl
            from launcher.plugins.types import DeviceProvider

            @hookimpl
            def launcher_device_providers():
                yield DeviceProvider(
                    name="npu",
                    description="NPUs found under /dev",
                    count_devices=lambda: len(glob.glob("/dev/npu[0-9]*")),
                    visible_devices_env="NPU_VISIBLE_DEVICES",
                )
        """

    @hookspec
    def launcher_cluster_environments(self) -> Iterable[ClusterEnvironment]:  # type: ignore[empty-body]
        """Register cluster environments (``--cluster NAME``): schedulers whose variables describe the job.

        Example, a scheduler that exports ``GRID_NODES``, ``GRID_NODE_INDEX`` and ``GRID_HEAD``::

            from launcher.clusters import ClusterInfo, derived_port
            from launcher.plugins import hookimpl
            from launcher.plugins.types import ClusterEnvironment

            def _detect(environ):
                if "GRID_JOB" not in environ:
                    return None
                return ClusterInfo(
                    scheduler="Grid", job=f"job {environ['GRID_JOB']}",
                    nnodes=int(environ["GRID_NODES"]), node_rank=int(environ["GRID_NODE_INDEX"]),
                    master_addr=environ["GRID_HEAD"], master_port=derived_port(environ["GRID_JOB"]),
                    run_id=f"grid-{environ['GRID_JOB']}",
                    sources={"nnodes": "GRID_NODES", "node_rank": "GRID_NODE_INDEX"},
                )

            @hookimpl
            def launcher_cluster_environments():
                yield ClusterEnvironment(name="grid", description="Grid jobs (GRID_JOB)",
                                         detect=_detect, variables=("GRID_JOB",))
        """

    @hookspec
    def launcher_health_checks(self) -> Iterable[HealthCheck]:  # type: ignore[empty-body]
        """Register health checks (``--health-checks NAME``), run before each round a node joins.

        Example, a node is sick when ``/scratch`` is not mounted (``--health-checks scratch``, or
        every launch when ``default=True``)::

            import os

            from launcher.health.api import healthy, sick, skipped
            from launcher.plugins import hookimpl
            from launcher.plugins.types import HealthCheck

            def _scratch_mounted(context):
                if not os.path.isdir("/scratch"):
                    return skipped("no /scratch on this node")
                if not os.path.ismount("/scratch"):
                    return sick("/scratch is not mounted")
                return healthy()

            @hookimpl
            def launcher_health_checks():
                yield HealthCheck(name="scratch", description="/scratch is mounted",
                                  check=_scratch_mounted, time_limit=5.0, default=False)
        """

    @hookspec
    def launcher_topology_sources(self) -> Iterable[TopologySource]:  # type: ignore[empty-body]
        """Register topology sources (``--topology NAME``): where this node sits in the network.

        Example, a site inventory that knows each host's rack and switch from a JSON file that
        maps host names to ``"row3.rack12"``::

            import json

            from launcher.plugins import hookimpl
            from launcher.plugins.types import TopologySource
            from launcher.topology.api import NodeLocation, NoLocation

            def _locate(query):
                with open("/etc/inventory.json") as file:
                    racks = json.load(file)
                for name in query.names:
                    if name in racks:
                        return NodeLocation(tuple(racks[name].split(".")))
                raise NoLocation(f"{query.describe} is not in /etc/inventory.json")

            @hookimpl
            def launcher_topology_sources():
                yield TopologySource(name="inventory", description="Racks from /etc/inventory.json",
                                     locate=_locate)
        """

    @hookspec
    def launcher_flag_groups(self) -> Iterable[FlagGroup[Any]]:  # type: ignore[empty-body]
        """Add command-line flags (``launcher --help`` shows each group under its title).

        A group's ``read`` parses and checks its flags and returns one settings object, found by
        the group's name in the plan's ``settings`` and in an event sink's ``context.settings``.
        Each flag also reads its ``PET_*`` variable when it is not given. Flags are spelled out in
        full (only torchrun's may be abbreviated), and a name another group uses is an error.
        Example, a sink whose destination is a flag::

            from typing import NamedTuple

            from launcher.errors import UsageError
            from launcher.flags import Flag, FlagGroup
            from launcher.plugins import hookimpl

            class AuditSettings(NamedTuple):  # every launch imports it: lighter than a dataclass
                path: str

            def _read(values):
                path = values["audit_path"]
                if not path.strip():
                    raise UsageError(f"{values.source('audit_path')} is empty: give a file name")
                return AuditSettings(path)

            @hookimpl
            def launcher_flag_groups():
                yield FlagGroup(name="audit", title="audit sink", read=_read, flags=(
                    Flag("--audit-path", default="audit.log", help="Where the audit sink writes."),
                ))
        """
