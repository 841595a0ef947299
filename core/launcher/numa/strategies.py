"""The built-in NUMA affinity strategies, with torchrun's names.

A strategy is any object with ``cpus_for_workers(topology, devices, nproc)`` returning one CPU set
per local rank (see :class:`AffinityStrategy`). Local rank ``r`` uses device ``devices[r]``; the
built-ins place each worker near its device:

``node``
    every CPU of the NUMA node the device is attached to.
``socket``
    every CPU of every NUMA node on that node's socket (the same as ``node`` with one node per
    socket).
``exclusive``
    the node's physical cores split into contiguous, disjoint shares among the workers whose
    devices sit on that node; the first workers get one core more when the split is uneven, and a
    core's hardware threads always stay together.
``core-complex``
    one last-level-cache group (an AMD CCX/CCD, an Intel sub-NUMA cluster) of the node per worker,
    largest groups first; workers share groups only when the node has more such workers than
    groups.

Unlike torchrun, ``exclusive`` and ``core-complex`` divide a node among the workers of this job,
not among every GPU on it: ``--nproc-per-node 2`` on an 8-GPU host gives each worker half a node
rather than a quarter.

A strategy raises :class:`~launcher.numa.topology.NumaBindingError` when it cannot apply.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from launcher.numa.topology import DeviceLocation, NumaBindingError, Topology, format_cpulist


class AffinityStrategy(Protocol):
    """What a ``NumaStrategy`` registration's ``create()`` returns."""

    def cpus_for_workers(
        self, topology: Topology, devices: Sequence[DeviceLocation], nproc: int
    ) -> Sequence[Collection[int]]:
        """One set of CPU numbers per local rank, ``0 .. nproc-1``."""
        ...


def device_nodes(topology: Topology, devices: Sequence[DeviceLocation], nproc: int) -> list[int]:
    """The NUMA node of each local rank's device; raises when one is unknown or missing."""
    if not devices:
        raise NumaBindingError("it places workers by their devices, and there are none to follow")
    if len(devices) < nproc:
        raise NumaBindingError(f"{nproc} workers but only {len(devices)} devices; each worker needs its own")
    nodes: list[int] = []
    for device in devices[:nproc]:
        if device.numa_node is None:
            where = f"PCI device {device.pci_bus_id}" if device.pci_bus_id else "it has no PCI bus id"
            raise NumaBindingError(f"cannot tell the NUMA node of device {device.index} ({where})")
        node = topology.nodes.get(device.numa_node)
        if node is None or not node.cpus:
            raise NumaBindingError(
                f"device {device.index} is on NUMA node {device.numa_node}, which has none of the CPUs "
                f"this process may use ({format_cpulist(topology.allowed)})"
            )
        nodes.append(device.numa_node)
    return nodes


def _split_each_node(
    topology: Topology,
    devices: Sequence[DeviceLocation],
    nproc: int,
    split: Callable[[int, int], list[frozenset[int]]],
) -> list[frozenset[int]]:
    """One CPU set per local rank, when a node's CPUs are divided among the workers on it.

    Local ranks are grouped by the NUMA node of their device; ``split(node, count)`` gives the
    ``count`` workers of ``node`` their CPU sets, in local-rank order.
    """
    ranks_by_node: dict[int, list[int]] = {}
    for rank, node in enumerate(device_nodes(topology, devices, nproc)):
        ranks_by_node.setdefault(node, []).append(rank)
    result: list[frozenset[int]] = [frozenset()] * nproc
    for node, ranks in ranks_by_node.items():
        for rank, cpus in zip(ranks, split(node, len(ranks)), strict=True):
            result[rank] = cpus
    return result


def _group(cpus: Collection[int], key_of: Callable[[int], frozenset[int]]) -> list[frozenset[int]]:
    """Partition ``cpus`` by a grouping function, groups ordered by their lowest CPU."""
    groups: dict[int, set[int]] = {}
    for cpu in cpus:
        members = key_of(cpu) or frozenset({cpu})
        groups.setdefault(min(members), set()).add(cpu)
    return [frozenset(groups[key]) for key in sorted(groups)]


class NodeStrategy:
    """Each worker on every allowed CPU of its device's NUMA node."""

    def cpus_for_workers(
        self, topology: Topology, devices: Sequence[DeviceLocation], nproc: int
    ) -> list[frozenset[int]]:
        return [topology.nodes[node].cpus for node in device_nodes(topology, devices, nproc)]


class SocketStrategy:
    """Each worker on every allowed CPU of the socket holding its device's NUMA node."""

    def cpus_for_workers(
        self, topology: Topology, devices: Sequence[DeviceLocation], nproc: int
    ) -> list[frozenset[int]]:
        result: list[frozenset[int]] = []
        for node in device_nodes(topology, devices, nproc):
            package = topology.package_of(min(topology.nodes[node].cpus))
            if package is None:
                raise NumaBindingError(f"sysfs does not say which socket NUMA node {node} is on")
            cpus: frozenset[int] = frozenset()
            for other in topology.nodes_of_package(package):
                cpus |= topology.nodes[other].cpus
            result.append(cpus)
        return result


class ExclusiveStrategy:
    """Each worker on its own share of the physical cores of its device's NUMA node."""

    def cpus_for_workers(
        self, topology: Topology, devices: Sequence[DeviceLocation], nproc: int
    ) -> list[frozenset[int]]:
        def split(node: int, count: int) -> list[frozenset[int]]:
            cores = _group(topology.nodes[node].cpus, topology.core_of)
            share, extra = divmod(len(cores), count)
            if share == 0:
                raise NumaBindingError(
                    f"NUMA node {node} has {len(cores)} usable physical cores for {count} workers; "
                    "exclusive binding needs at least one each"
                )
            shares: list[frozenset[int]] = []
            start = 0
            for position in range(count):
                size = share + (1 if position < extra else 0)
                shares.append(frozenset().union(*cores[start : start + size]))
                start += size
            return shares

        return _split_each_node(topology, devices, nproc, split)


def _cache_group(topology: Topology, node_cpus: frozenset[int], cpu: int) -> frozenset[int]:
    group = topology.last_level_cache_of(cpu)
    if group is None:
        raise NumaBindingError(f"sysfs has no cache information for CPU {cpu}")
    # A cache shared beyond the node still groups only this node's CPUs.
    return group & node_cpus


class CoreComplexStrategy:
    """Each worker on one last-level-cache group of its device's NUMA node."""

    def cpus_for_workers(
        self, topology: Topology, devices: Sequence[DeviceLocation], nproc: int
    ) -> list[frozenset[int]]:
        def split(node: int, count: int) -> list[frozenset[int]]:
            cpus = topology.nodes[node].cpus
            cache_group = functools.partial(_cache_group, topology, cpus)
            # Bigger complexes first: with fewer workers than complexes, workers get the roomiest.
            complexes = sorted(_group(cpus, cache_group), key=lambda group: (-len(group), min(group)))
            return [complexes[position % len(complexes)] for position in range(count)]

        return _split_each_node(topology, devices, nproc, split)
