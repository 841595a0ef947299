"""Reading the topology from sysfs: CPU lists, nodes, cores, caches, device nodes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from launcher.numa import Topology, format_cpulist, parse_cpulist

from .conftest import HostTree, two_socket_eight_gpus, write_sysfs


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}),
        ("5", {5}),
        ("", set()),
        ("0-6:2", {0, 2, 4, 6}),
        (" 1 , 3-4 ", {1, 3, 4}),
    ],
)
def test_parse_cpulist(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize(
    ("cpus", "text"), [({0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"), ({7}, "7"), (set(), ""), ({2, 4}, "2,4")]
)
def test_format_cpulist(cpus: set[int], text: str) -> None:
    assert format_cpulist(cpus) == text
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize("fixture_host", ["two_socket"], indirect=True)
def test_reads_nodes_cores_caches_and_sockets(fixture_host: HostTree) -> None:
    topology = Topology(fixture_host.root)
    assert sorted(topology.nodes) == [0, 1]
    assert topology.nodes[0].cpus == frozenset(range(0, 8)) | frozenset(range(16, 24))
    assert topology.core_of(3) == frozenset({3, 19})
    assert topology.last_level_cache_of(3) == topology.nodes[0].cpus
    assert topology.package_of(27) == 1
    assert topology.node_of_cpu(27) == 1
    assert topology.nodes_of_package(1) == [1]
    assert topology.device_node("0000:9a:00.0") == 1
    assert topology.device_node("0000:9A:00.0") == 1  # bus ids compare without case
    assert topology.device_node("0000:00:00.0") is None  # no such device


def test_allowed_cpus_limit_every_set(tmp_path: Path) -> None:
    root = str(write_sysfs(tmp_path, two_socket_eight_gpus()))
    topology = Topology(root, allowed={0, 1, 16, 8})
    assert topology.nodes[0].cpus == frozenset({0, 1, 16})
    assert topology.nodes[0].all_cpus == frozenset(range(0, 8)) | frozenset(range(16, 24))
    assert topology.core_of(1) == frozenset({1})  # its sibling 17 is not ours
    assert topology.last_level_cache_of(0) == frozenset({0, 1, 16})


def test_default_allowed_is_the_process_affinity(
    fixture_host_two_socket: HostTree, set_affinity: Callable[[Iterable[int]], None]
) -> None:
    set_affinity({2, 3})
    assert Topology(fixture_host_two_socket.root).allowed == frozenset({2, 3})


@pytest.fixture
def fixture_host_two_socket(tmp_path: Path) -> HostTree:
    host = two_socket_eight_gpus()
    return HostTree("two_socket", host, str(write_sysfs(tmp_path, host)))


@pytest.mark.parametrize("fixture_host", ["no_node"], indirect=True)
def test_numa_node_minus_one(fixture_host: HostTree) -> None:
    topology = Topology(fixture_host.root)
    assert topology.device_node("0000:17:00.0") == 0
    assert topology.device_node("0000:ca:00.0") == 1  # placed by its local_cpulist
    assert topology.device_node("0000:e3:00.0") is None  # local_cpulist spans both nodes


def test_numa_node_minus_one_on_a_single_node_host(tmp_path: Path) -> None:
    host = two_socket_eight_gpus()
    host.nodes = {0: sorted(host.cpus)}
    host.devices = {"0000:01:00.0": (-1, None)}
    topology = Topology(str(write_sysfs(tmp_path, host)), allowed=host.cpus)
    assert topology.device_node("0000:01:00.0") == 0


def test_kernel_without_numa_is_one_node(tmp_path: Path) -> None:
    (tmp_path / "devices" / "system" / "cpu").mkdir(parents=True)
    (tmp_path / "devices" / "system" / "cpu" / "online").write_text("0-3\n")
    topology = Topology(str(tmp_path), allowed={0, 1, 2, 3})
    assert list(topology.nodes) == [0]
    assert topology.nodes[0].cpus == frozenset({0, 1, 2, 3})
    # No SMT or cache files: every CPU is its own core, and there is no cache information.
    assert topology.core_of(2) == frozenset({2})
    assert topology.last_level_cache_of(2) is None


def test_this_machines_sysfs() -> None:
    if not os.path.isdir("/sys/devices/system/cpu"):
        pytest.skip("no sysfs here")
    topology = Topology("/sys")
    allowed = frozenset(os.sched_getaffinity(0))
    assert topology.allowed == allowed
    assert frozenset().union(*(node.cpus for node in topology.nodes.values())) == allowed
    for cpu in allowed:
        assert cpu in topology.core_of(cpu)
        assert topology.node_of_cpu(cpu) is not None
