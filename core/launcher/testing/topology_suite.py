"""Conformance suite for topology sources (``launcher_topology_sources``).

A source's ``locate(query)`` returns where the node the query describes sits in the network (a
:class:`~launcher.topology.api.NodeLocation`), or raises
:class:`~launcher.topology.api.NoLocation` with one line saying why it cannot. The suite asks it
about nodes the test class says it places and nodes it says it does not, and checks that the
answers are locations the rendezvous can order by (nodes of one domain adjacent), that asking
twice answers the same and changes nothing, that a refusal is one line, and that
``--topology NAME`` reaches the source through the core's own lookup.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from launcher.errors import UsageError
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import Registration, TopologySource
from launcher.testing.plugin_suite import PluginModuleConformance, manager_holding
from launcher.topology.api import NodeLocation, NoLocation, TopologyQuery

__all__ = ["TopologySourceConformance"]


class TopologySourceConformance(PluginModuleConformance):
    """Tests a topology source on sample nodes.

    Set ``topology_source_name`` (the ``--topology`` name) or override the ``topology_source``
    fixture, and give the nodes to ask about: ``placed`` (queries the source must place; at
    least two, from at least two domains, is best) and ``unplaced`` (queries it must refuse with
    :class:`~launcher.topology.api.NoLocation`), as class attributes or by overriding the
    fixtures of the same names (a fixture can write a site file under ``tmp_path`` first). A
    query's ``argument`` is what follows ``NAME:`` (``None`` for a source without one).
    """

    registration_type: ClassVar[type[Registration]] = TopologySource
    registration_fixture: ClassVar[str] = "topology_source"

    #: The ``--topology`` name under test.
    topology_source_name: ClassVar[str | None] = None
    #: Nodes the source must place.
    placed_nodes: ClassVar[Sequence[TopologyQuery]] = ()
    #: Nodes the source must refuse (NoLocation).
    unplaced_nodes: ClassVar[Sequence[TopologyQuery]] = ()

    @pytest.fixture
    def topology_source(self, plugin_manager: LauncherPluginManager) -> TopologySource:
        """The registration under test (default: ``topology_source_name`` on the plugin manager)."""
        return self.registration_under_test(plugin_manager, self.topology_source_name, TopologySource)

    @pytest.fixture
    def placed(self) -> Sequence[TopologyQuery]:
        """Queries the source must place (default: :attr:`placed_nodes`)."""
        return self.placed_nodes

    @pytest.fixture
    def unplaced(self) -> Sequence[TopologyQuery]:
        """Queries the source must refuse (default: :attr:`unplaced_nodes`)."""
        return self.unplaced_nodes

    @staticmethod
    def _need(queries: Sequence[TopologyQuery], what: str) -> Sequence[TopologyQuery]:
        if not queries:
            pytest.skip(f"no {what} nodes given")
        return queries

    def test_placed_nodes_get_a_path(self, topology_source: TopologySource, placed: Sequence[TopologyQuery]) -> None:
        for number, query in enumerate(self._need(placed, "placed")):
            location = topology_source.locate(query)
            assert isinstance(location, NodeLocation), (
                f"node {number} ({query.describe}): locate() returned {type(location).__name__}, not a NodeLocation"
            )
            assert location.path and all(location.path), f"node {number}: empty path {location.path}"
            assert "\n" not in str(location) and " " not in str(location), f"node {number}: path {location!s}"

    def test_answers_are_stable_and_change_nothing(
        self, topology_source: TopologySource, placed: Sequence[TopologyQuery]
    ) -> None:
        for query in self._need(placed, "placed"):
            before = copy.deepcopy(dict(query.environ))
            first = topology_source.locate(query)
            assert dict(query.environ) == before, "locate() changed the environment it was given"
            assert topology_source.locate(query) == first, "locate() answered differently twice"

    def test_unplaced_nodes_say_why_in_one_line(
        self, topology_source: TopologySource, unplaced: Sequence[TopologyQuery]
    ) -> None:
        for number, query in enumerate(self._need(unplaced, "unplaced")):
            with pytest.raises(NoLocation) as caught:
                topology_source.locate(query)
            message = str(caught.value).strip()
            assert message and "\n" not in message, f"node {number}: the reason must be one line, got {message!r}"

    def test_locations_order_a_round_by_domain(
        self, topology_source: TopologySource, placed: Sequence[TopologyQuery]
    ) -> None:
        """The closer's order over the placed nodes (joining in reverse) keeps each domain together."""
        from launcher.rendezvous.rounds import sealed_value
        from launcher.topology.order import location_record

        queries = self._need(placed, "placed")
        nodes: list[dict[str, Any]] = []
        for number, query in reversed(list(enumerate(queries))):
            location = topology_source.locate(query)
            nodes.append({"id": f"node{number}", "addr": f"10.99.{number // 250}.{number % 250 + 1}", "pid": 1,
                          "lid": 0, "idx": len(nodes) + 1, "topo": location_record(location.path, location.order)})
        value = sealed_value(nodes, len(nodes), 1, stable_rank0=False, closer="node0")
        paths = value["paths"]
        seen: list[str] = []
        for path in paths:
            if seen and path != seen[-1]:
                assert path not in seen, f"the nodes of {path} are not adjacent in rank order: {paths}"
            seen.append(path)

    def test_reached_by_the_topology_option(
        self, topology_source: TopologySource, placed: Sequence[TopologyQuery]
    ) -> None:
        from launcher.topology.locate import locate_node, parse_topology

        query = self._need(placed, "placed")[0]
        manager = manager_holding(topology_source)
        for name in topology_source.names:
            text = f"{name}:{query.argument}" if query.argument is not None else name
            settings = parse_topology(text)
            try:
                location = locate_node(settings, manager, query.address, query.environ)
            except UsageError as exc:  # the source may match on host names this machine lacks
                assert "\n" not in str(exc), f"--topology {text}: a refusal must be one line"
                continue
            assert isinstance(location, NodeLocation)
        if topology_source.takes_argument:
            with pytest.raises(UsageError):
                locate_node(parse_topology(topology_source.name), manager, query.address, query.environ)

    def test_does_not_import_torch(self, topology_source: TopologySource, placed: Sequence[TopologyQuery]) -> None:
        if "torch" in sys.modules:
            pytest.skip("torch is imported in this process already")
        for query in placed:
            topology_source.locate(query)
        assert "torch" not in sys.modules, "locate() imported torch: the agent must stay without it"
