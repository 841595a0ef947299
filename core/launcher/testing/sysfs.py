"""Made-up hosts for NUMA tests: a sysfs tree that :class:`launcher.numa.Topology` reads.

:class:`FakeTopology` describes a host (NUMA nodes and their CPUs, sockets, SMT siblings, last-level
cache groups, PCI devices and their nodes) and writes the files the topology reader looks at
under any directory, so a strategy can be tested on hosts the test machine is not.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from launcher.numa.topology import format_cpulist

__all__ = ["FakeTopology", "standard_topologies"]


@dataclass(frozen=True)
class FakeTopology:
    """A host to write as a sysfs tree.

    ``nodes`` maps each NUMA node to its CPUs and ``sockets`` each node to its socket (default:
    node ``n`` on socket ``n``). ``cores`` lists the hardware threads of each physical core
    (default: every CPU its own core) and ``caches`` the CPUs sharing each last-level cache
    (default: none written). ``devices`` maps PCI bus ids, in device order, to the NUMA node
    the firmware reports (``-1`` for "unknown").
    """

    name: str
    nodes: Mapping[int, tuple[int, ...]]
    sockets: Mapping[int, int] = field(default_factory=dict)
    cores: tuple[tuple[int, ...], ...] = ()
    caches: tuple[tuple[int, ...], ...] = ()
    devices: Mapping[str, int] = field(default_factory=dict)

    @property
    def cpus(self) -> frozenset[int]:
        """Every CPU of the host."""
        return frozenset(cpu for cpus in self.nodes.values() for cpu in cpus)

    @property
    def bus_ids(self) -> list[str]:
        """The devices' PCI bus ids, in device order."""
        return list(self.devices)

    def write(self, root: str | os.PathLike[str]) -> str:
        """Write the tree under ``root`` (created if missing); returns ``root`` as a string."""
        base = os.fspath(root)
        cpu_dir = os.path.join(base, "devices", "system", "cpu")
        _write(os.path.join(cpu_dir, "online"), format_cpulist(self.cpus))
        core_of = {cpu: core for core in self.cores for cpu in core}
        for node, cpus in self.nodes.items():
            _write(os.path.join(base, "devices", "system", "node", f"node{node}", "cpulist"), format_cpulist(cpus))
            for cpu in cpus:
                topology = os.path.join(cpu_dir, f"cpu{cpu}", "topology")
                _write(os.path.join(topology, "physical_package_id"), str(self.sockets.get(node, node)))
                _write(os.path.join(topology, "thread_siblings_list"), format_cpulist(core_of.get(cpu, (cpu,))))
        for group in self.caches:
            for cpu in group:
                cache = os.path.join(cpu_dir, f"cpu{cpu}", "cache")
                _write(os.path.join(cache, "index0", "level"), "1")
                _write(os.path.join(cache, "index0", "type"), "Data")
                _write(os.path.join(cache, "index0", "shared_cpu_list"), format_cpulist(core_of.get(cpu, (cpu,))))
                _write(os.path.join(cache, "index3", "level"), "3")
                _write(os.path.join(cache, "index3", "type"), "Unified")
                _write(os.path.join(cache, "index3", "shared_cpu_list"), format_cpulist(group))
        for bus_id, node in self.devices.items():
            device = os.path.join(base, "bus", "pci", "devices", bus_id)
            _write(os.path.join(device, "numa_node"), str(node))
            local = self.nodes.get(node, tuple(sorted(self.cpus)))
            _write(os.path.join(device, "local_cpulist"), format_cpulist(local))
        return base


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text + "\n")


def _smt_pairs(cpus: Iterable[int], offset: int) -> tuple[tuple[int, ...], ...]:
    return tuple((cpu, cpu + offset) for cpu in cpus)


def standard_topologies() -> list[FakeTopology]:
    """Hosts every NUMA strategy is tried on by :class:`~launcher.testing.NumaStrategyConformance`.

    One node with two devices; two sockets with SMT, two cache groups per node and two devices
    per node; four nodes on two sockets with a device each; and a host whose firmware does not
    say where its devices are.
    """
    return [
        FakeTopology(
            name="one-node",
            nodes={0: (0, 1, 2, 3)},
            devices={"0000:17:00.0": 0, "0000:18:00.0": 0},
        ),
        FakeTopology(
            name="two-sockets-smt",
            nodes={0: (0, 1, 2, 3, 8, 9, 10, 11), 1: (4, 5, 6, 7, 12, 13, 14, 15)},
            sockets={0: 0, 1: 1},
            cores=_smt_pairs(range(8), 8),
            caches=((0, 1, 8, 9), (2, 3, 10, 11), (4, 5, 12, 13), (6, 7, 14, 15)),
            devices={"0000:17:00.0": 0, "0000:2a:00.0": 0, "0000:8a:00.0": 1, "0000:9c:00.0": 1},
        ),
        FakeTopology(
            name="four-nodes-two-sockets",
            nodes={0: (0, 1, 2, 3), 1: (4, 5, 6, 7), 2: (8, 9, 10, 11), 3: (12, 13, 14, 15)},
            sockets={0: 0, 1: 0, 2: 1, 3: 1},
            caches=((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)),
            devices={"0000:17:00.0": 0, "0000:3b:00.0": 1, "0000:86:00.0": 2, "0000:af:00.0": 3},
        ),
        FakeTopology(
            name="unknown-device-nodes",
            nodes={0: (0, 1), 1: (2, 3)},
            devices={"0000:17:00.0": -1, "0000:18:00.0": -1},
        ),
    ]
