"""The CPU and NUMA topology of this host, read from sysfs and limited to the CPUs we may use.

Files read, all relative to a configurable root (``/sys`` by default, a fixture tree in tests):

* ``devices/system/node/node<N>/cpulist``: the CPUs of each NUMA node;
* ``devices/system/cpu/cpu<N>/topology/physical_package_id``: the socket of a CPU;
* ``devices/system/cpu/cpu<N>/topology/thread_siblings_list``: the hardware threads of its core;
* ``devices/system/cpu/cpu<N>/cache/index<I>/{level,type,shared_cpu_list}``: which CPUs share its
  last-level cache (its core complex);
* ``bus/pci/devices/<bus id>/{numa_node,local_cpulist}``: where a PCI device is attached.

Every CPU set is intersected with the process's affinity (``os.sched_getaffinity``) when the
topology is read, so a strategy can never bind a worker to a CPU that a cgroup or ``taskset``
took away from the launcher. Per-CPU files are read on first use: strategies touch only what
they need.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass


class NumaBindingError(RuntimeError):
    """A strategy cannot produce a binding on this host (the message says why)."""


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse the kernel's CPU list format (``0-3,8,10-11``) into a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        if sep:
            # The kernel may add a stride (``0-15:2``) in some lists.
            last, _, stride = last.partition(":")
            cpus.update(range(int(first), int(last) + 1, int(stride) if stride else 1))
        else:
            cpus.add(int(first))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Write CPU numbers in the kernel's compact list format (``0-3,8,10-11``)."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        ranges.append(str(ordered[start]) if start == end else f"{ordered[start]}-{ordered[end]}")
        start = end + 1
    return ",".join(ranges)


def process_affinity() -> frozenset[int]:
    """The CPUs this process may run on (all online CPUs where the OS cannot say)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        return frozenset(getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: ``cpus`` are those this process may use, ``all_cpus`` as sysfs lists them."""

    id: int
    cpus: frozenset[int]
    all_cpus: frozenset[int]


@dataclass(frozen=True)
class DeviceLocation:
    """Where the device that local rank ``index`` uses is attached.

    ``numa_node`` is ``None`` when it cannot be told (no bus id, or the firmware reports no node on
    a multi-node host).
    """

    index: int
    pci_bus_id: str | None
    numa_node: int | None


class Topology:
    """NUMA nodes, sockets, cores and caches of the host under ``sysfs_root``.

    ``allowed`` defaults to the process's affinity; every set this class returns is within it.
    """

    def __init__(self, sysfs_root: str = "/sys", allowed: Iterable[int] | None = None) -> None:
        self.root = sysfs_root
        self.allowed = frozenset(process_affinity() if allowed is None else allowed)
        self.nodes: dict[int, NumaNode] = self._read_nodes()
        self._package: dict[int, int | None] = {}
        self._core: dict[int, frozenset[int]] = {}
        self._llc: dict[int, frozenset[int]] = {}

    # -- reading -------------------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def _read(self, *parts: str) -> str | None:
        try:
            with open(self._path(*parts), encoding="ascii") as handle:
                return handle.read().strip()
        except (OSError, UnicodeDecodeError):
            return None

    def _read_nodes(self) -> dict[int, NumaNode]:
        base = self._path("devices", "system", "node")
        try:
            entries = os.listdir(base)
        except OSError:
            entries = []
        nodes: dict[int, NumaNode] = {}
        for entry in entries:
            if not entry.startswith("node") or not entry[4:].isdigit():
                continue
            text = self._read("devices", "system", "node", entry, "cpulist")
            if text is None:
                continue
            cpus = parse_cpulist(text)
            nodes[int(entry[4:])] = NumaNode(int(entry[4:]), cpus & self.allowed, cpus)
        if not nodes:
            # A kernel built without NUMA support has no node directory: the host is one node.
            online = self._read("devices", "system", "cpu", "online")
            cpus = parse_cpulist(online) if online else self.allowed
            nodes[0] = NumaNode(0, cpus & self.allowed, cpus)
        return dict(sorted(nodes.items()))

    # -- CPUs ----------------------------------------------------------------------------------

    def node_of_cpu(self, cpu: int) -> int | None:
        """The NUMA node holding ``cpu``."""
        for node in self.nodes.values():
            if cpu in node.all_cpus:
                return node.id
        return None

    def package_of(self, cpu: int) -> int | None:
        """The socket (physical package) of ``cpu``, ``None`` if sysfs does not say."""
        if cpu not in self._package:
            text = self._read("devices", "system", "cpu", f"cpu{cpu}", "topology", "physical_package_id")
            try:
                self._package[cpu] = int(text) if text is not None else None
            except ValueError:
                self._package[cpu] = None
        return self._package[cpu]

    def core_of(self, cpu: int) -> frozenset[int]:
        """The allowed hardware threads of ``cpu``'s physical core (just ``cpu`` without SMT data)."""
        if cpu not in self._core:
            text = self._read("devices", "system", "cpu", f"cpu{cpu}", "topology", "thread_siblings_list")
            siblings = parse_cpulist(text) if text else frozenset({cpu})
            self._core[cpu] = (siblings | {cpu}) & self.allowed
        return self._core[cpu]

    def last_level_cache_of(self, cpu: int) -> frozenset[int] | None:
        """Allowed CPUs sharing ``cpu``'s last-level data cache (its core complex), if sysfs says."""
        if cpu not in self._llc:
            found = self._read_llc(cpu)
            if found is None:
                return None
            self._llc[cpu] = (found | {cpu}) & self.allowed
        return self._llc[cpu]

    def _read_llc(self, cpu: int) -> frozenset[int] | None:
        cache_dir = ("devices", "system", "cpu", f"cpu{cpu}", "cache")
        try:
            entries = os.listdir(self._path(*cache_dir))
        except OSError:
            return None
        best_level = -1
        best: frozenset[int] | None = None
        for entry in entries:
            if not entry.startswith("index") or not entry[5:].isdigit():
                continue
            # Instruction caches are never the last level a workload's data shares.
            if self._read(*cache_dir, entry, "type") not in ("Unified", "Data"):
                continue
            level_text = self._read(*cache_dir, entry, "level")
            shared = self._read(*cache_dir, entry, "shared_cpu_list")
            if level_text is None or not level_text.isdigit() or shared is None:
                continue
            if int(level_text) > best_level:
                best_level, best = int(level_text), parse_cpulist(shared)
        return best

    def nodes_of_package(self, package: int) -> list[int]:
        """NUMA nodes whose allowed CPUs sit on socket ``package``."""
        return [
            node.id
            for node in self.nodes.values()
            if node.cpus and any(self.package_of(cpu) == package for cpu in node.cpus)
        ]

    # -- devices -------------------------------------------------------------------------------

    def device_node(self, pci_bus_id: str) -> int | None:
        """The NUMA node a PCI device is attached to, ``None`` if it cannot be told.

        Firmware on some hosts (many VMs, some single-socket boards) writes ``-1``. Then: on a host
        with one NUMA node the answer is that node; otherwise the device's ``local_cpulist`` decides
        when it lies within one node, and nothing does when it spans several.
        """
        device = ("bus", "pci", "devices", pci_bus_id.strip().lower())
        text = self._read(*device, "numa_node")
        if text is None:
            return None
        try:
            node = int(text)
        except ValueError:
            return None
        if node >= 0:
            return node
        with_cpus = [n.id for n in self.nodes.values() if n.all_cpus]
        if len(with_cpus) == 1:
            return with_cpus[0]
        local = self._read(*device, "local_cpulist")
        if not local:
            return None
        local_cpus = parse_cpulist(local)
        inside = [n.id for n in self.nodes.values() if local_cpus and local_cpus <= n.all_cpus]
        return inside[0] if len(inside) == 1 else None

    def locate(self, pci_bus_ids: Iterable[str | None]) -> list[DeviceLocation]:
        """A :class:`DeviceLocation` for each bus id, in order."""
        return [
            DeviceLocation(index, bus_id, self.device_node(bus_id) if bus_id else None)
            for index, bus_id in enumerate(pci_bus_ids)
        ]
