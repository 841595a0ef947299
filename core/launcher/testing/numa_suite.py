"""Conformance suite for NUMA strategies (``launcher_numa_strategies``).

A strategy's ``cpus_for_workers(topology, devices, nproc)`` must return one non-empty CPU set per
local rank, within the CPUs the launcher may use, or raise
:class:`~launcher.numa.NumaBindingError` saying why it cannot apply. The suite asks it on the
hosts of :func:`~launcher.testing.sysfs.standard_topologies` (and any the test class adds), with
all CPUs allowed and with a restricted affinity, for one worker, two, one per device and one
more than there are devices, and with no device at all.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from launcher.numa.topology import DeviceLocation, NumaBindingError, Topology
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import NumaStrategy, Registration
from launcher.testing.plugin_suite import PluginModuleConformance
from launcher.testing.sysfs import FakeTopology, standard_topologies

__all__ = ["NumaStrategyConformance"]


def _restricted(cpus: frozenset[int]) -> frozenset[int]:
    """Every CPU but the first and one in the middle: a taskset or cgroup cpuset."""
    ordered = sorted(cpus)
    if len(ordered) < 3:
        return cpus
    return frozenset(ordered) - {ordered[0], ordered[len(ordered) // 2]}


class NumaStrategyConformance(PluginModuleConformance):
    """Tests a NUMA strategy on made-up hosts.

    Set ``numa_strategy_name`` (the ``--numa-binding`` name) or override the ``numa_strategy``
    fixture. ``topologies`` lists the hosts tried (default: the standard ones);
    ``must_apply`` (default true) requires the strategy to produce a plan on at least one of
    them, so that a strategy that always refuses does not pass.
    """

    registration_type: ClassVar[type[Registration]] = NumaStrategy
    registration_fixture: ClassVar[str] = "numa_strategy"

    #: The ``--numa-binding`` name under test.
    numa_strategy_name: ClassVar[str | None] = None
    #: Hosts to try; ``None``: :func:`~launcher.testing.sysfs.standard_topologies`.
    topologies: ClassVar[Sequence[FakeTopology] | None] = None
    #: Whether the strategy must produce a plan on at least one host.
    must_apply: ClassVar[bool] = True

    @pytest.fixture
    def numa_strategy(self, plugin_manager: LauncherPluginManager) -> NumaStrategy:
        """The registration under test (default: ``numa_strategy_name`` on the plugin manager)."""
        return self.registration_under_test(plugin_manager, self.numa_strategy_name, NumaStrategy)

    def _hosts(self) -> Sequence[FakeTopology]:
        return self.topologies if self.topologies is not None else standard_topologies()

    def _plan(
        self, strategy: Any, topology: Topology, devices: Sequence[DeviceLocation], nproc: int, where: str
    ) -> list[frozenset[int]] | None:
        try:
            plan = strategy.cpus_for_workers(topology, devices, nproc)
        except NumaBindingError as exc:
            assert str(exc).strip(), f"{where}: NumaBindingError must say why the strategy cannot apply"
            return None
        assert isinstance(plan, Sequence) and not isinstance(plan, (str, bytes)), (
            f"{where}: cpus_for_workers returned {type(plan).__name__}, not a sequence of CPU sets"
        )
        assert len(plan) == nproc, f"{where}: {len(plan)} CPU sets for {nproc} workers"
        sets: list[frozenset[int]] = []
        for rank, cpus in enumerate(plan):
            assert isinstance(cpus, Collection), f"{where}: local rank {rank} got {cpus!r}, not a set of CPUs"
            assert all(isinstance(cpu, int) and not isinstance(cpu, bool) for cpu in cpus), (
                f"{where}: local rank {rank} got non-integer CPUs {sorted(cpus, key=str)}"
            )
            chosen = frozenset(cpus)
            assert chosen, f"{where}: local rank {rank} got no CPU"
            outside = chosen - topology.allowed
            assert not outside, f"{where}: local rank {rank} got CPUs {sorted(outside)} outside the allowed ones"
            sets.append(chosen)
        return sets

    def test_create_returns_a_strategy(self, numa_strategy: NumaStrategy) -> None:
        strategy = numa_strategy.create()
        assert callable(getattr(strategy, "cpus_for_workers", None)), (
            "create() must return an object with cpus_for_workers"
        )

    def test_one_cpu_set_per_rank_within_the_allowed_cpus(self, numa_strategy: NumaStrategy, tmp_path: Path) -> None:
        applied = 0
        for host in self._hosts():
            root = host.write(tmp_path / host.name)
            for allowed in (host.cpus, _restricted(host.cpus)):
                topology = Topology(root, allowed=allowed)
                devices = topology.locate(host.bus_ids)
                for nproc in sorted({1, 2, len(devices), len(devices) + 1} - {0}):
                    restricted = "restricted" if allowed != host.cpus else "all CPUs"
                    where = f"host {host.name!r} ({restricted}), {nproc} workers"
                    plan = self._plan(numa_strategy.create(), topology, devices, nproc, where)
                    applied += plan is not None
        if self.must_apply:
            assert applied, "the strategy refused every host it was tried on; set must_apply = False if intended"

    def test_no_devices(self, numa_strategy: NumaStrategy, tmp_path: Path) -> None:
        # A numeric --nproc-per-node on a host without accelerators gives a strategy no devices.
        host = self._hosts()[0]
        topology = Topology(host.write(tmp_path / "host"), allowed=host.cpus)
        self._plan(numa_strategy.create(), topology, [], 2, f"host {host.name!r} without devices")

    def test_does_not_change_the_topology(self, numa_strategy: NumaStrategy, tmp_path: Path) -> None:
        for host in self._hosts():
            topology = Topology(host.write(tmp_path / host.name), allowed=host.cpus)
            nodes = dict(topology.nodes)
            devices = topology.locate(host.bus_ids)
            self._plan(numa_strategy.create(), topology, devices, max(1, len(devices)), f"host {host.name!r}")
            assert topology.nodes == nodes and topology.allowed == host.cpus, "the strategy changed the topology"
