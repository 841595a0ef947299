"""Topology sources against launcher.testing's suite: the built-ins, and a site's own source
installed the way pip leaves a third party's distribution (a package and its ``*.dist-info``)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
from launcher.health.nvml import RecordedNvml
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import TopologySource
from launcher.testing import TopologySourceConformance
from launcher.topology.api import TopologyQuery
from launcher.topology.sources import nvml_location

from tests.topology import nvml_fabric

SITE = "10.0.0.1 spine0.leaf1\n10.0.0.2 spine0.leaf2\n10.0.0.3 spine0.leaf1\nnode4 spine0.leaf2\n"


class TestFileTopology(TopologySourceConformance):
    topology_source_name = "file"

    @pytest.fixture
    def site(self, tmp_path: Path) -> str:
        path = tmp_path / "site.txt"
        path.write_text(SITE)
        return str(path)

    @pytest.fixture
    def placed(self, site: str) -> Sequence[TopologyQuery]:
        return [TopologyQuery(argument=site, address=f"10.0.0.{i}") for i in (1, 2, 3)] + [
            TopologyQuery(argument=site, address="10.9.0.4", hostnames=("node4",))]

    @pytest.fixture
    def unplaced(self, site: str) -> Sequence[TopologyQuery]:
        return [TopologyQuery(argument=site, address="10.0.0.9", hostnames=("node9",))]


def _slurm(addr: str) -> TopologyQuery:
    return TopologyQuery(environ={"SLURM_TOPOLOGY_ADDR": addr, "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node"})


class TestSlurmTopology(TopologySourceConformance):
    topology_source_name = "slurm"
    placed_nodes = [_slurm("core.s1.gpu01"), _slurm("core.s2.gpu02"), _slurm("core.s1.gpu03")]
    unplaced_nodes = [TopologyQuery(environ={"SLURM_JOB_ID": "7"}),
                      TopologyQuery(environ={"SLURM_TOPOLOGY_ADDR": "gpu01", "SLURM_TOPOLOGY_ADDR_PATTERN": "node"})]


class TestNvmlTopology(TopologySourceConformance):
    """The registered source; on a machine without NVIDIA's driver it must say so in one line."""

    topology_source_name = "nvml"

    @pytest.fixture
    def unplaced(self) -> Sequence[TopologyQuery]:
        from launcher.health.gpu import nvidia_driver_present

        if nvidia_driver_present():
            pytest.skip("an NVIDIA driver is here: tests/gpu asks the real NVML")
        return [TopologyQuery(address="10.0.0.1")]


def _recorded(query: TopologyQuery) -> object:
    """NVML answers recorded on two GB200 racks, chosen by the node's address."""
    answers = {"10.0.0.1": nvml_fabric.NODE_A, "10.0.0.2": nvml_fabric.NODE_B, "10.0.0.3": nvml_fabric.NODE_A,
               "10.0.0.4": nvml_fabric.NOT_SUPPORTED}[query.address or ""]
    return nvml_location(query, load=lambda: RecordedNvml(answers))


class TestNvmlTopologyRecorded(TopologySourceConformance):
    """``nvml``'s reading of NVML, on the recorded answers of nodes in two NVLink domains."""

    placed_nodes = [TopologyQuery(address=f"10.0.0.{i}") for i in (1, 2, 3)]
    unplaced_nodes = [TopologyQuery(address="10.0.0.4")]

    @pytest.fixture
    def topology_source(self) -> TopologySource:
        return TopologySource(name="nvml", locate=_recorded, auto=True, priority=90)  # type: ignore[arg-type]


INVENTORY_PLUGIN = textwrap.dedent(
    '''
    """A site's inventory service as a topology source: rows and racks from a JSON file."""
    import json

    from launcher.plugins import hookimpl
    from launcher.plugins.types import TopologySource
    from launcher.topology.api import NodeLocation, NoLocation


    def _locate(query):
        with open(query.environ["SITE_INVENTORY"]) as file:
            racks = json.load(file)
        for name in query.names:
            if name in racks:
                return NodeLocation(tuple(racks[name].split(".")))
        raise NoLocation(f"{query.describe} is not in the inventory")


    @hookimpl
    def launcher_topology_sources():
        yield TopologySource(name="inventory", description="Rows and racks from the site inventory",
                             locate=_locate)
    '''
)


@pytest.fixture
def installed_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    (site / "site_inventory").mkdir(parents=True)
    (site / "site_inventory" / "__init__.py").write_text(INVENTORY_PLUGIN)
    info = site / "site_inventory-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: site-inventory\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[launcher]\ninventory = site_inventory\n")
    monkeypatch.syspath_prepend(str(site))
    inventory = tmp_path / "inventory.json"
    inventory.write_text('{"10.0.0.1": "row1.rack3", "10.0.0.2": "row1.rack4", "10.0.0.3": "row1.rack3"}')
    return inventory


class TestThirdPartyTopology(TopologySourceConformance):
    topology_source_name = "inventory"

    @pytest.fixture
    def plugin_manager(self, installed_inventory: Path) -> LauncherPluginManager:
        from launcher.plugins.manager import get_plugin_manager

        return get_plugin_manager(environ={})

    @pytest.fixture
    def placed(self, installed_inventory: Path) -> Sequence[TopologyQuery]:
        return [TopologyQuery(address=f"10.0.0.{i}", environ={"SITE_INVENTORY": str(installed_inventory)})
                for i in (1, 2, 3)]

    @pytest.fixture
    def unplaced(self, installed_inventory: Path) -> Sequence[TopologyQuery]:
        return [TopologyQuery(address="10.0.0.9", environ={"SITE_INVENTORY": str(installed_inventory)})]

    def test_listed_as_the_distributions(self, plugin_manager: LauncherPluginManager) -> None:
        from launcher.plugins.listing import registration_rows

        [row] = [row for row in registration_rows(plugin_manager) if row.name == "inventory"]
        assert (row.kind, row.distribution, row.version, row.plugin) == (
            "topology source", "site-inventory", "1.0", "inventory")
