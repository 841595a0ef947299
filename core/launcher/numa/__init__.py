"""NUMA affinity: which CPUs each local worker may run on (``--numa-binding NAME``).

The agent calls :func:`plan_affinity` once per worker group, logs the result and puts it in the
workers-started event, then binds each worker with ``os.sched_setaffinity`` before user code runs
(:mod:`launcher.agent.process`): in the child between fork and exec for command entrypoints,
first thing for function entrypoints. A freshly forked child has a single thread, so binding it
binds everything the worker starts later. Nothing here runs ``numactl``.

Strategies are plugins (``launcher_numa_strategies``); the built-ins are in
:mod:`launcher.numa.strategies` and the topology they read in :mod:`launcher.numa.topology`.
See ``docs/devices-and-numa.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Literal

from launcher.errors import LaunchError
from launcher.numa.strategies import AffinityStrategy
from launcher.numa.topology import (
    DeviceLocation,
    NumaBindingError,
    NumaNode,
    Topology,
    format_cpulist,
    parse_cpulist,
    process_affinity,
)
from launcher.plugins.types import DeviceProvider, NumaStrategy

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from launcher.plugins.manager import LauncherPluginManager

__all__ = [
    "AffinityStrategy",
    "DeviceLocation",
    "NumaBindingError",
    "NumaNode",
    "Topology",
    "format_cpulist",
    "parse_cpulist",
    "plan_affinity",
    "process_affinity",
]

log = logging.getLogger("launcher.numa")


def _device_bus_ids(
    provider: DeviceProvider | None, manager: LauncherPluginManager
) -> tuple[list[str | None], str]:
    """The PCI bus ids to place workers by, and which provider gave them (for messages)."""
    from launcher.devices import registered_providers

    label = ""
    if provider is None:
        # A numeric --nproc-per-node names no device kind; torchrun binds to GPUs then, and so do
        # we, through whatever accelerator ``auto`` would pick.
        try:
            provider = manager.get(DeviceProvider, "auto")
        except Exception:  # no auto provider (blocked): nothing to follow
            return [], "--nproc-per-node is a number and no 'auto' device provider is available"
        label = "--nproc-per-node is a number and 'auto' found "
    if provider.choose is not None:  # a provider standing for another: follow the one it picks
        provider = provider.choose(registered_providers(manager))
    if provider.pci_bus_ids is None:
        return [], f"{label}device provider {provider.name!r}, which reports no PCI bus ids"
    return list(provider.pci_bus_ids()), f"{label}device provider {provider.name!r}"


def _check_plan(plan: Sequence[Collection[int]], nproc: int, topology: Topology) -> list[frozenset[int]]:
    if len(plan) != nproc:
        raise NumaBindingError(f"the strategy returned {len(plan)} CPU sets for {nproc} workers")
    result: list[frozenset[int]] = []
    for rank, cpus in enumerate(plan):
        chosen = frozenset(int(cpu) for cpu in cpus)
        if not chosen:
            raise NumaBindingError(f"the strategy left local rank {rank} without CPUs")
        outside = chosen - topology.allowed
        if outside:
            raise NumaBindingError(
                f"the strategy gave local rank {rank} CPUs {format_cpulist(outside)}, outside this "
                f"process's affinity {format_cpulist(topology.allowed)}"
            )
        result.append(chosen)
    return result


def plan_affinity(
    strategy: str,
    nproc: int,
    provider: DeviceProvider | None,
    manager: LauncherPluginManager,
    *,
    sysfs_root: str = "/sys",
    on_failure: Literal["warn", "error"] = "warn",
) -> list[frozenset[int]] | None:
    """One CPU set per local rank, chosen by the NUMA strategy called ``strategy``.

    Local rank ``r`` is placed near device ``r`` of ``provider`` (as located through its PCI bus
    ids); with ``provider=None`` (a numeric ``--nproc-per-node``) the devices are those of the
    provider ``auto`` picks. The topology is read under ``sysfs_root`` and limited to this
    process's affinity.

    When the strategy cannot apply (no device locations, too few cores, unreadable sysfs), logs a
    warning and returns ``None`` (workers then run unbound) if ``on_failure`` is ``"warn"``, or
    raises :class:`~launcher.errors.LaunchError` if it is ``"error"``. An unknown strategy name
    raises the plugin manager's not-found error either way.
    """
    if on_failure not in ("warn", "error"):
        raise ValueError(f"on_failure must be 'warn' or 'error', not {on_failure!r}")
    registration = manager.get(NumaStrategy, strategy)
    source = ""
    devices: list[DeviceLocation] = []
    try:
        if nproc < 1:
            raise NumaBindingError(f"nothing to bind for {nproc} workers")
        topology = Topology(sysfs_root)
        bus_ids, source = _device_bus_ids(provider, manager)
        devices = topology.locate(bus_ids)
        implementation: AffinityStrategy = registration.create()
        plan = _check_plan(implementation.cpus_for_workers(topology, devices, nproc), nproc, topology)
    except Exception as exc:
        reason = str(exc) if isinstance(exc, NumaBindingError) else f"{type(exc).__name__}: {exc}"
        if source and not devices:
            reason = f"{reason} ({source})"
        message = f"--numa-binding {strategy} cannot apply: {reason}"
        if on_failure == "error":
            raise LaunchError(message) from exc
        log.warning(
            "%s; workers will run without CPU binding", message, exc_info=log.isEnabledFor(logging.DEBUG)
        )
        return None
    # The agent logs the plan it applies (and puts it in the workers-started event).
    for rank, cpus in enumerate(plan):
        log.debug("--numa-binding %s: local rank %d on CPUs %s", strategy, rank, format_cpulist(cpus))
    return plan

