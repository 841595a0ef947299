"""Every built-in strategy against every fixture host, through plan_affinity."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import pytest
from launcher.errors import LaunchError
from launcher.numa import plan_affinity
from launcher.plugins.manager import LauncherPluginManager, PluginNotFoundError
from launcher.plugins.types import DeviceProvider

from .conftest import Host, HostTree

STRATEGIES = ["node", "socket", "exclusive", "core-complex"]


def provider_for(host: Host) -> DeviceProvider:
    """A device provider reporting the host's devices, as any provider with bus ids does."""
    return DeviceProvider(
        name="fixture", count_devices=lambda: len(host.devices), pci_bus_ids=lambda: list(host.bus_ids)
    )


def cores(first: int, last: int, *, total_cores: int, smt: bool = True) -> frozenset[int]:
    """CPUs of cores ``first..last`` (both threads with SMT, Linux numbering)."""
    cpus = set(range(first, last + 1))
    if smt:
        cpus |= {c + total_cores for c in cpus}
    return frozenset(cpus)


# -- 2 sockets, 8 GPUs, SMT ---------------------------------------------------------------------

TS = 16  # cores on the two-socket host
NODE0 = cores(0, 7, total_cores=TS)
NODE1 = cores(8, 15, total_cores=TS)

TWO_SOCKET = {
    "node": [NODE0] * 4 + [NODE1] * 4,
    "socket": [NODE0] * 4 + [NODE1] * 4,
    "exclusive": [cores(2 * i, 2 * i + 1, total_cores=TS) for i in range(8)],
    "core-complex": [NODE0] * 4 + [NODE1] * 4,  # one L3 per socket
}

# -- several L3 complexes per socket ------------------------------------------------------------

ML = 32  # cores on the multi-L3 host


def ml_node(n: int) -> frozenset[int]:
    return cores(8 * n, 8 * n + 7, total_cores=ML)


def ccx(k: int) -> frozenset[int]:
    return cores(4 * k, 4 * k + 3, total_cores=ML)


# GPUs on nodes [0, 0, 1, 1, 2, 2, 2, 3]
MULTI_L3 = {
    "node": [ml_node(0)] * 2 + [ml_node(1)] * 2 + [ml_node(2)] * 3 + [ml_node(3)],
    "socket": [ml_node(0) | ml_node(1)] * 4 + [ml_node(2) | ml_node(3)] * 4,
    "exclusive": [
        cores(0, 3, total_cores=ML),
        cores(4, 7, total_cores=ML),
        cores(8, 11, total_cores=ML),
        cores(12, 15, total_cores=ML),
        cores(16, 18, total_cores=ML),  # 8 cores for 3 workers: 3, 3, 2
        cores(19, 21, total_cores=ML),
        cores(22, 23, total_cores=ML),
        cores(24, 31, total_cores=ML),  # alone on node 3
    ],
    # Node 2 has two complexes for three workers: the third shares the first.
    "core-complex": [ccx(0), ccx(1), ccx(2), ccx(3), ccx(4), ccx(5), ccx(4), ccx(6)],
}

# -- devices with numa_node -1 ------------------------------------------------------------------

NN0 = frozenset(range(0, 8))
NN1 = frozenset(range(8, 16))
NO_NODE_FIRST_THREE = {
    "node": [NN0, NN1, NN1],  # device 2 is placed by its local_cpulist
    "socket": [NN0, NN1, NN1],
    "exclusive": [NN0, frozenset(range(8, 12)), frozenset(range(12, 16))],
    "core-complex": [NN0, NN1, NN1],
}

EXPECTED = {"two_socket": (8, TWO_SOCKET), "multi_l3": (8, MULTI_L3), "no_node": (3, NO_NODE_FIRST_THREE)}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fixture_host", ["two_socket", "multi_l3", "no_node"], indirect=True)
def test_strategy_on_fixture_host(
    fixture_host: HostTree, strategy: str, manager: LauncherPluginManager
) -> None:
    host, root = fixture_host.host, fixture_host.root
    nproc, expected = EXPECTED[fixture_host.key]
    plan = plan_affinity(strategy, nproc, provider_for(host), manager, sysfs_root=root, on_failure="error")
    assert plan == expected[strategy]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fixture_host", ["no_node"], indirect=True)
def test_device_without_a_node_cannot_be_followed(
    fixture_host: HostTree,
    strategy: str,
    manager: LauncherPluginManager,
    caplog: pytest.LogCaptureFixture,
) -> None:
    host, root = fixture_host.host, fixture_host.root
    with pytest.raises(LaunchError) as info:
        plan_affinity(strategy, 4, provider_for(host), manager, sysfs_root=root, on_failure="error")
    assert str(info.value) == (
        f"--numa-binding {strategy} cannot apply: "
        "cannot tell the NUMA node of device 3 (PCI device 0000:e3:00.0)"
    )
    with caplog.at_level(logging.WARNING, logger="launcher.numa"):
        assert plan_affinity(strategy, 4, provider_for(host), manager, sysfs_root=root) is None
    assert "0000:e3:00.0" in caplog.text and "without CPU binding" in caplog.text


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fixture_host", ["two_socket", "multi_l3"], indirect=True)
def test_fewer_workers_use_the_first_devices(
    fixture_host: HostTree, strategy: str, manager: LauncherPluginManager
) -> None:
    host, root = fixture_host.host, fixture_host.root
    plan = plan_affinity(strategy, 2, provider_for(host), manager, sysfs_root=root, on_failure="error")
    assert plan is not None and len(plan) == 2
    assert all(cpus and cpus <= host.cpus for cpus in plan)
    if strategy == "exclusive":
        assert not plan[0] & plan[1]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fixture_host", ["two_socket"], indirect=True)
def test_more_workers_than_devices(
    fixture_host: HostTree, strategy: str, manager: LauncherPluginManager
) -> None:
    host, root = fixture_host.host, fixture_host.root
    with pytest.raises(LaunchError, match="9 workers but only 8 devices"):
        plan_affinity(strategy, 9, provider_for(host), manager, sysfs_root=root, on_failure="error")


@pytest.mark.parametrize("fixture_host", ["two_socket"], indirect=True)
def test_exclusive_needs_a_core_per_worker(
    fixture_host: HostTree, manager: LauncherPluginManager, set_affinity: Callable[[Iterable[int]], None]
) -> None:
    host, root = fixture_host.host, fixture_host.root
    set_affinity([0, 16, 1, 17, 8, 9])  # two cores (four threads) left on node 0
    with pytest.raises(LaunchError, match="NUMA node 0 has 2 usable physical cores for 4 workers"):
        plan_affinity("exclusive", 8, provider_for(host), manager, sysfs_root=root, on_failure="error")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fixture_host", ["two_socket"], indirect=True)
def test_plans_stay_within_the_process_affinity(
    fixture_host: HostTree,
    strategy: str,
    manager: LauncherPluginManager,
    set_affinity: Callable[[Iterable[int]], None],
) -> None:
    host, root = fixture_host.host, fixture_host.root
    allowed = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}  # as a cgroup cpuset might
    set_affinity(allowed)
    plan = plan_affinity(strategy, 8, provider_for(host), manager, sysfs_root=root, on_failure="error")
    assert plan is not None
    assert all(cpus <= allowed for cpus in plan)
    if strategy in ("node", "socket", "core-complex"):
        assert plan[0] == frozenset({0, 1, 2, 3, 16, 17, 18, 19})
        assert plan[7] == frozenset({8, 9, 10, 11, 24, 25, 26, 27})
    else:
        assert plan[0] == frozenset({0, 16}) and plan[4] == frozenset({8, 24})
        assert plan[3] == frozenset({3, 19}) and plan[7] == frozenset({11, 27})


@pytest.mark.parametrize("fixture_host", ["two_socket"], indirect=True)
def test_node_with_no_allowed_cpu(
    fixture_host: HostTree, manager: LauncherPluginManager, set_affinity: Callable[[Iterable[int]], None]
) -> None:
    host, root = fixture_host.host, fixture_host.root
    set_affinity(range(0, 8))
    with pytest.raises(
        LaunchError, match="device 4 is on NUMA node 1, which has none of the CPUs this process may use"
    ):
        plan_affinity("node", 8, provider_for(host), manager, sysfs_root=root, on_failure="error")


@pytest.mark.parametrize("fixture_host", ["two_socket"], indirect=True)
def test_unknown_strategy_is_a_usage_error_even_when_warning(
    fixture_host: HostTree, manager: LauncherPluginManager
) -> None:
    host, root = fixture_host.host, fixture_host.root
    with pytest.raises(PluginNotFoundError, match="choose one of core-complex, exclusive, node, socket"):
        plan_affinity("nodes", 8, provider_for(host), manager, sysfs_root=root)


@pytest.mark.parametrize("fixture_host", ["two_socket"], indirect=True)
def test_provider_without_bus_ids(fixture_host: HostTree, manager: LauncherPluginManager) -> None:
    root = fixture_host.root
    bare = DeviceProvider(name="bare", count_devices=lambda: 8)
    with pytest.raises(LaunchError) as info:
        plan_affinity("node", 8, bare, manager, sysfs_root=root, on_failure="error")
    assert str(info.value) == (
        "--numa-binding node cannot apply: it places workers by their devices, and there are none to follow "
        "(device provider 'bare', which reports no PCI bus ids)"
    )


def test_unreadable_sysfs_falls_back(
    tmp_path: object, manager: LauncherPluginManager, caplog: pytest.LogCaptureFixture
) -> None:
    provider = DeviceProvider(name="x", count_devices=lambda: 1, pci_bus_ids=lambda: ["0000:01:00.0"])
    with caplog.at_level(logging.WARNING, logger="launcher.numa"):
        assert plan_affinity("node", 1, provider, manager, sysfs_root=str(tmp_path)) is None
    assert "cannot tell the NUMA node of device 0 (PCI device 0000:01:00.0)" in caplog.text


def test_on_failure_must_be_warn_or_error(manager: LauncherPluginManager) -> None:
    with pytest.raises(ValueError):
        plan_affinity("node", 1, None, manager, on_failure="ignore")  # type: ignore[arg-type]
