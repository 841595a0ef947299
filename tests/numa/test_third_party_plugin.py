"""A third-party distribution adds a NUMA strategy and a device provider through entry points.

The distribution is installed the way pip leaves one on disk: a package plus a ``*.dist-info``
directory with ``METADATA`` and ``entry_points.txt`` (group ``launcher``), on ``sys.path``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from launcher.devices import resolve_nproc_per_node, virtual_local_rank_env
from launcher.numa import plan_affinity
from launcher.plugins.listing import registration_rows
from launcher.plugins.manager import PluginNotFoundError, get_plugin_manager
from launcher.plugins.types import DeviceProvider, NumaStrategy

from .conftest import HostTree

PLUGIN = textwrap.dedent(
    '''
    """A launcher plugin shipped by another distribution."""
    from launcher.plugins import hookimpl
    from launcher.plugins.types import DeviceProvider, NumaStrategy


    class RoundRobinNodes:
        """Rank r on NUMA node r mod (nodes with CPUs): needs no device at all."""

        def cpus_for_workers(self, topology, devices, nproc):
            nodes = [node.cpus for node in topology.nodes.values() if node.cpus]
            return [nodes[rank % len(nodes)] for rank in range(nproc)]


    @hookimpl
    def launcher_numa_strategies():
        yield NumaStrategy(name="round-robin", description="Ranks spread over NUMA nodes",
                           create=RoundRobinNodes)


    @hookimpl
    def launcher_device_providers():
        yield DeviceProvider(
            name="testacc",
            description="Test accelerators, two per socket",
            count_devices=lambda: 4,
            pci_bus_ids=lambda: ["0000:18:00.0", "0000:2a:00.0", "0000:9a:00.0", "0000:ab:00.0"],
            visible_devices_env="TESTACC_VISIBLE_DEVICES",
        )
    '''
)


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    package = site / "launcher_testacc"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PLUGIN)
    info = site / "launcher_testacc-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: launcher-testacc\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[launcher]\ntestacc = launcher_testacc\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_get_plugin_manager_finds_both(installed_plugin: Path) -> None:
    manager = get_plugin_manager(environ={})
    assert "round-robin" in manager.names(NumaStrategy)
    assert "testacc" in manager.names(DeviceProvider)
    rows = {row.name: row for row in registration_rows(manager)}
    assert rows["testacc"].distribution == "launcher-testacc"
    assert rows["testacc"].version == "0.3"
    assert rows["round-robin"].plugin == "testacc"


@pytest.mark.parametrize("fixture_host", ["two_socket"], indirect=True)
def test_the_plugins_provider_and_strategy_work(installed_plugin: Path, fixture_host: HostTree) -> None:
    manager = get_plugin_manager(environ={})
    count, provider = resolve_nproc_per_node("testacc", manager)
    assert count == 4 and provider is not None and provider.name == "testacc"
    assert virtual_local_rank_env(provider, 3, {}) == {"LOCAL_RANK": "0", "TESTACC_VISIBLE_DEVICES": "3"}

    node0 = frozenset(range(0, 8)) | frozenset(range(16, 24))
    node1 = frozenset(range(8, 16)) | frozenset(range(24, 32))
    # The plugin's strategy ignores devices ...
    plan = plan_affinity(
        "round-robin", 4, provider, manager, sysfs_root=fixture_host.root, on_failure="error"
    )
    assert plan == [node0, node1, node0, node1]
    # ... and a built-in strategy follows the plugin's devices (two per socket).
    plan = plan_affinity("node", 4, provider, manager, sysfs_root=fixture_host.root, on_failure="error")
    assert plan == [node0, node0, node1, node1]


def test_disabling_autoload_leaves_it_out(installed_plugin: Path) -> None:
    manager = get_plugin_manager(environ={"LAUNCHER_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "node" in manager.names(NumaStrategy)  # the core's own stay
    assert "round-robin" not in manager.names(NumaStrategy)
    with pytest.raises(PluginNotFoundError):
        resolve_nproc_per_node("testacc", manager)
