"""Fixture sysfs trees for the NUMA tests, built in temporary directories.

:func:`write_sysfs` writes the files :mod:`launcher.numa.topology` reads, from a small
description of a host. The hosts below are the ones every strategy is tested against; the
process's affinity is set to the fixture host's CPUs (``os.sched_getaffinity`` is the one thing
patched: a 32- or 64-CPU machine cannot exist here).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from launcher.numa import format_cpulist
from launcher.plugins.manager import LauncherPluginManager, get_plugin_manager


@dataclass
class Host:
    """What a sysfs tree says about a host."""

    name: str
    nodes: dict[int, list[int]]  # NUMA node -> CPUs
    package: dict[int, int]  # CPU -> socket
    siblings: dict[int, list[int]]  # CPU -> hardware threads of its core
    l3: dict[int, list[int]]  # CPU -> CPUs sharing its L3
    #: PCI bus id -> (numa_node as written, local_cpulist or None), in the provider's order.
    devices: dict[str, tuple[int, list[int] | None]] = field(default_factory=dict)

    @property
    def cpus(self) -> frozenset[int]:
        return frozenset(cpu for cpus in self.nodes.values() for cpu in cpus)

    @property
    def bus_ids(self) -> list[str]:
        return list(self.devices)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def write_sysfs(root: Path, host: Host) -> Path:
    """Write ``host`` as a sysfs tree under ``root`` and return ``root``."""
    system = root / "devices" / "system"
    all_cpus = sorted(host.cpus)
    _write(system / "node" / "possible", format_cpulist(host.nodes))
    _write(system / "node" / "online", format_cpulist(host.nodes))
    for node, cpus in host.nodes.items():
        _write(system / "node" / f"node{node}" / "cpulist", format_cpulist(cpus))
    _write(system / "cpu" / "online", format_cpulist(all_cpus))
    for cpu in all_cpus:
        base = system / "cpu" / f"cpu{cpu}"
        _write(base / "topology" / "physical_package_id", str(host.package[cpu]))
        _write(base / "topology" / "thread_siblings_list", format_cpulist(host.siblings[cpu]))
        core = format_cpulist(host.siblings[cpu])
        # The caches a real x86 core lists: L1d, L1i, L2 per core, L3 shared.
        for index, (level, kind, shared) in enumerate(
            [(1, "Data", core), (1, "Instruction", core), (2, "Unified", core), (3, "Unified", None)]
        ):
            cache = base / "cache" / f"index{index}"
            _write(cache / "level", str(level))
            _write(cache / "type", kind)
            _write(cache / "shared_cpu_list", shared or format_cpulist(host.l3[cpu]))
    for bus_id, (numa_node, local) in host.devices.items():
        device = root / "bus" / "pci" / "devices" / bus_id
        _write(device / "numa_node", str(numa_node))
        _write(device / "local_cpulist", format_cpulist(local if local is not None else all_cpus))
    return root


def _smt_host(
    name: str,
    *,
    sockets: int,
    nodes_per_socket: int,
    complexes_per_node: int,
    cores_per_complex: int,
    smt: bool,
) -> Host:
    """Linux numbering: first threads of all cores are CPUs 0..C-1, second threads C..2C-1."""
    cores_per_node = complexes_per_node * cores_per_complex
    total_cores = sockets * nodes_per_socket * cores_per_node
    threads = 2 if smt else 1
    host = Host(name=name, nodes={}, package={}, siblings={}, l3={})
    for core in range(total_cores):
        node = core // cores_per_node
        complex_first = core - core % cores_per_complex
        complex_cores = range(complex_first, complex_first + cores_per_complex)
        cpus_of_core = [core + t * total_cores for t in range(threads)]
        complex_cpus = [c + t * total_cores for c in complex_cores for t in range(threads)]
        for cpu in cpus_of_core:
            host.nodes.setdefault(node, []).append(cpu)
            host.package[cpu] = node // nodes_per_socket
            host.siblings[cpu] = cpus_of_core
            host.l3[cpu] = complex_cpus
    host.nodes = {node: sorted(cpus) for node, cpus in host.nodes.items()}
    return host


def two_socket_eight_gpus() -> Host:
    """2 sockets, one NUMA node each, 8 cores x 2 threads per socket; 4 GPUs per socket."""
    host = _smt_host(
        "2-socket, 8 GPUs, SMT",
        sockets=2,
        nodes_per_socket=1,
        complexes_per_node=1,
        cores_per_complex=8,
        smt=True,
    )
    for bus in ("18", "2a", "3a", "5d"):
        host.devices[f"0000:{bus}:00.0"] = (0, None)
    for bus in ("9a", "ab", "ba", "db"):
        host.devices[f"0000:{bus}:00.0"] = (1, None)
    return host


def several_l3_per_socket() -> Host:
    """2 sockets x 2 NUMA nodes (NPS2), each node 2 core complexes of 4 cores x 2 threads.

    GPUs: two on node 0, two on node 1, three on node 2, one on node 3.
    """
    host = _smt_host(
        "several L3 complexes per socket",
        sockets=2,
        nodes_per_socket=2,
        complexes_per_node=2,
        cores_per_complex=4,
        smt=True,
    )
    for index, node in enumerate([0, 0, 1, 1, 2, 2, 2, 3]):
        host.devices[f"0000:{0x10 + index * 0x20:02x}:00.0"] = (node, None)
    return host


def some_devices_without_node() -> Host:
    """2 sockets, one node each, 8 cores without SMT; firmware gives two of four GPUs node -1.

    Device 2's local_cpulist still lies within node 1; device 3's spans the whole host.
    """
    host = _smt_host(
        "devices with numa_node -1",
        sockets=2,
        nodes_per_socket=1,
        complexes_per_node=1,
        cores_per_complex=8,
        smt=False,
    )
    host.devices["0000:17:00.0"] = (0, None)
    host.devices["0000:65:00.0"] = (1, None)
    host.devices["0000:ca:00.0"] = (-1, list(range(8, 16)))
    host.devices["0000:e3:00.0"] = (-1, list(range(16)))
    return host


HOSTS: dict[str, Callable[[], Host]] = {
    "two_socket": two_socket_eight_gpus,
    "multi_l3": several_l3_per_socket,
    "no_node": some_devices_without_node,
}


@pytest.fixture
def manager() -> LauncherPluginManager:
    """A fresh plugin manager with the installed plugins (the built-ins among them)."""
    return get_plugin_manager(environ={})


@pytest.fixture
def set_affinity(monkeypatch: pytest.MonkeyPatch) -> Callable[[Iterable[int]], None]:
    """Pretend this process may run on the given CPUs."""

    def _set(cpus: Iterable[int]) -> None:
        allowed = set(cpus)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(allowed))

    return _set


@dataclass(frozen=True)
class HostTree:
    """A fixture host written to disk: ``key`` in :data:`HOSTS`, the host, and the sysfs root."""

    key: str
    host: Host
    root: str


@pytest.fixture(scope="session")
def sysfs_trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every fixture host written once per session (tests only read them)."""
    base = tmp_path_factory.mktemp("sysfs")
    return {key: str(write_sysfs(base / key, make())) for key, make in HOSTS.items()}


@pytest.fixture
def fixture_host(
    request: pytest.FixtureRequest,
    sysfs_trees: dict[str, str],
    set_affinity: Callable[[Iterable[int]], None],
) -> HostTree:
    """The host named by the test's parameter, on disk, with its CPUs as our affinity."""
    host = HOSTS[request.param]()
    set_affinity(host.cpus)
    return HostTree(request.param, host, sysfs_trees[request.param])
