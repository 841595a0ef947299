"""Every built-in strategy against this machine's own /sys (a single NUMA node here).

The devices are real PCI devices of this machine, located by a provider that reports their bus
ids, as a GPU provider would report its GPUs'.
"""

from __future__ import annotations

import os

import pytest
from launcher.errors import LaunchError
from launcher.numa import Topology, plan_affinity
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import DeviceProvider

PCI = "/sys/bus/pci/devices"


def _real_bus_ids(limit: int) -> list[str]:
    if not os.path.isdir(PCI):
        return []
    found = [bus for bus in sorted(os.listdir(PCI)) if os.path.exists(os.path.join(PCI, bus, "numa_node"))]
    topology = Topology("/sys")
    return [bus for bus in found if topology.device_node(bus) is not None][:limit]


@pytest.mark.parametrize("strategy", ["node", "socket", "exclusive", "core-complex"])
def test_strategy_on_this_machine(strategy: str, manager: LauncherPluginManager) -> None:
    bus_ids = _real_bus_ids(2)
    if not bus_ids:
        pytest.skip("no PCI device with a known NUMA node on this machine")
    nproc = len(bus_ids)
    provider = DeviceProvider(name="real-pci", count_devices=lambda: nproc, pci_bus_ids=lambda: bus_ids)
    topology = Topology("/sys")
    nodes = [topology.device_node(bus) for bus in bus_ids]
    node_cpus = [topology.nodes[n].cpus for n in nodes if n is not None]

    if strategy == "exclusive":
        cores = {min(topology.core_of(cpu)) for cpu in node_cpus[0]}
        if len(set(nodes)) == 1 and len(cores) < nproc:
            with pytest.raises(LaunchError, match="exclusive binding needs at least one each"):
                plan_affinity(strategy, nproc, provider, manager, on_failure="error")
            return

    plan = plan_affinity(strategy, nproc, provider, manager, on_failure="error")
    assert plan is not None and len(plan) == nproc
    allowed = frozenset(os.sched_getaffinity(0))
    for rank, cpus in enumerate(plan):
        assert cpus and cpus <= allowed
        if strategy == "node":
            assert cpus == node_cpus[rank]
        elif strategy == "socket":
            assert cpus >= node_cpus[rank]
            assert len({topology.package_of(cpu) for cpu in cpus}) == 1
        elif strategy == "exclusive":
            assert cpus <= node_cpus[rank]
        else:
            llc = topology.last_level_cache_of(min(cpus))
            assert llc is not None and cpus == llc & node_cpus[rank]
    if strategy == "exclusive" and len(set(nodes)) == 1:
        assert not plan[0] & plan[-1] or nproc == 1
