"""Conformance suite for rendezvous backends, with simulated nodes.

The tests: a full round, MIN:MAX closing, late nodes, lost nodes, closing, timeouts and run-id
isolation, each run by nodes from :mod:`launcher.testing.simulated_nodes` (threads in the test
process, or a forked process SIGKILLed to play a crashed host). The simulated-node names stay
importable from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest

from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import Registration, RendezvousBackend
from launcher.rendezvous.api import RendezvousClosedError, RendezvousTimeoutError
from launcher.testing.plugin_suite import PluginModuleConformance
from launcher.testing.simulated_nodes import (
    NodeProcess,
    PendingRendezvous,
    SeverableStore,
    SimulatedNode,
    SimulatedNodes,
    create_handler,
)
from launcher.testing.store_suite import KeyValueStoreConformance, StoreFactory

__all__ = [
    "NodeProcess",
    "PendingRendezvous",
    "RendezvousBackendConformance",
    "SeverableStore",
    "SimulatedNode",
    "SimulatedNodes",
    "StoreBackendConformance",
    "create_handler",
]


def _has_core_algorithm() -> bool:
    try:
        from launcher.rendezvous.dynamic import handler_over_store  # noqa: F401
    except ImportError:
        return False
    return True


def _wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval)


class RendezvousBackendConformance(PluginModuleConformance):
    """Tests a rendezvous backend with simulated nodes.

    Set ``backend_name`` (the ``--rdzv-backend`` name; the backend is looked up on the
    ``plugin_manager`` fixture, so install the distribution or set ``plugin``) and provide the
    ``rendezvous_endpoint`` fixture (``--rdzv-endpoint``: start the service the backend talks to
    in a fixture). Optional fixtures: ``rendezvous_config`` (extra ``--rdzv-conf`` keys, e.g.
    credentials) and ``rendezvous_backend`` (the registration itself).

    The suite gives every node short timings through ``--rdzv-conf`` (class attributes below;
    keys outside the backend's ``config_keys`` are left out). A backend that cannot honour them
    tunes the attributes: ``heartbeat_timeout`` is the time after which a silent node must be
    reported lost, and ``detection_slack`` how much later it may be noticed.

    ``lost_node_method`` chooses how a node dies: ``"sever"`` cuts a store-only backend's node
    off its store, ``"process"`` runs the node in a forked process and SIGKILLs it, ``"auto"``
    (default) severs where it can.
    """

    registration_type: ClassVar[type[Registration]] = RendezvousBackend
    registration_fixture: ClassVar[str] = "rendezvous_backend"

    #: The ``--rdzv-backend`` name under test.
    backend_name: ClassVar[str | None] = None
    #: Nodes in the full-round test.
    node_count: ClassVar[int] = 4
    join_timeout: ClassVar[float] = 60.0
    last_call_timeout: ClassVar[float] = 1.0
    keep_alive_interval: ClassVar[float] = 0.25
    heartbeat_timeout: ClassVar[float] = 1.5
    #: Seconds beyond ``heartbeat_timeout`` within which a lost node must be reported.
    detection_slack: ClassVar[float] = 5.0
    #: Seconds allowed for anything that should happen "promptly" (a round, a wake-up).
    rendezvous_slack: ClassVar[float] = 20.0
    #: ``"auto"``, ``"sever"`` or ``"process"``.
    lost_node_method: ClassVar[str] = "auto"
    #: ``--local-addr`` of every simulated node.
    local_addr: ClassVar[str] = "127.0.0.1"

    # -- fixtures a backend's tests provide or override ----------------------------------------

    @pytest.fixture
    def rendezvous_backend(self, plugin_manager: LauncherPluginManager) -> RendezvousBackend:
        """The registration under test (default: ``backend_name`` on the plugin manager)."""
        return self.registration_under_test(plugin_manager, self.backend_name, RendezvousBackend)

    @pytest.fixture
    def rendezvous_endpoint(self) -> str:
        """Override: the ``--rdzv-endpoint`` every node uses."""
        pytest.fail(f"{type(self).__name__} must provide the rendezvous_endpoint fixture")

    @pytest.fixture
    def rendezvous_config(self) -> dict[str, str]:
        """Override to add ``--rdzv-conf`` keys (credentials, a key prefix)."""
        return {}

    @pytest.fixture
    def rendezvous_nodes(
        self, rendezvous_backend: RendezvousBackend, rendezvous_endpoint: str, rendezvous_config: dict[str, str]
    ) -> Iterator[SimulatedNodes]:
        """Makes simulated nodes; closes and shuts down all of them after the test."""
        if rendezvous_backend.create_store is not None and not _has_core_algorithm():
            pytest.skip("launcher.rendezvous.dynamic.handler_over_store (the core's rendezvous) is not available")
        nodes = SimulatedNodes(
            rendezvous_backend,
            rendezvous_endpoint,
            {**self.timing_config(), **rendezvous_config},
            local_addr=self.local_addr,
        )
        yield nodes
        nodes.close()

    def timing_config(self) -> dict[str, str]:
        """The ``--rdzv-conf`` timings every node gets, from the class attributes."""
        return {
            "join_timeout": f"{self.join_timeout:g}",
            "last_call_timeout": f"{self.last_call_timeout:g}",
            "keep_alive_interval": f"{self.keep_alive_interval:g}",
            "heartbeat_timeout": f"{self.heartbeat_timeout:g}",
        }

    def _uses_process(self, backend: RendezvousBackend) -> bool:
        if self.lost_node_method == "process":
            return True
        if self.lost_node_method == "sever":
            if backend.create_store is None:
                pytest.fail("lost_node_method='sever' needs a store-only backend (create_store)")
            return False
        return backend.create_store is None

    # -- a full round ------------------------------------------------------------------------------

    def test_round_gives_ranks_0_to_n_minus_1(self, rendezvous_nodes: SimulatedNodes) -> None:
        n = self.node_count
        run = rendezvous_nodes.run_id()
        nodes = rendezvous_nodes.nodes(n, run, n, n)
        infos = rendezvous_nodes.rendezvous_all(nodes, self.rendezvous_slack)
        assert sorted(info.group_rank for info in infos) == list(range(n))
        assert [info.group_world_size for info in infos] == [n] * n
        assert len({info.round for info in infos}) == 1, "the nodes disagree on the round"
        assert len({(info.master_addr, info.master_port) for info in infos}) == 1, (
            "the nodes disagree on where the workers' store is"
        )
        assert 0 < infos[0].master_port < 65536
        named = [info.participants for info in infos if info.participants]
        if named:  # a backend that names the participants must name the same ones everywhere
            assert all(p == named[0] for p in named), "the nodes disagree on the participants"
            assert len(set(named[0])) == n
        assert [node.handler.get_run_id() for node in nodes] == [run] * n
        assert not any(node.handler.is_closed() for node in nodes)

    def test_round_store_is_shared(self, rendezvous_nodes: SimulatedNodes) -> None:
        # The agents exchange ranks and meet at the exit barrier through this store.
        run = rendezvous_nodes.run_id()
        nodes = rendezvous_nodes.nodes(3, run, 3, 3)
        infos = rendezvous_nodes.rendezvous_all(nodes, self.rendezvous_slack)
        stores = [info.store for info in infos]
        assert all(store is not None for store in stores), "a multi-node round must give every node a store"
        by_rank = {info.group_rank: info.store for info in infos}
        assert by_rank[0] is not None
        by_rank[0].set("conformance/from-rank-0", b"hello")
        for store in stores:
            assert store is not None
            assert store.get("conformance/from-rank-0", timeout=10) == b"hello"
            store.add("conformance/count", 1)
        assert by_rank[0].add("conformance/count", 0) == 3

    def test_next_round_after_a_restart(self, rendezvous_nodes: SimulatedNodes) -> None:
        run = rendezvous_nodes.run_id()
        nodes = rendezvous_nodes.nodes(3, run, 3, 3)
        first = rendezvous_nodes.rendezvous_all(nodes, self.rendezvous_slack)
        second = rendezvous_nodes.rendezvous_all(nodes, self.rendezvous_slack)
        assert sorted(info.group_rank for info in second) == [0, 1, 2]
        assert all(b.round > a.round for a, b in zip(first, second, strict=True)), "a new round must have a new number"

    # -- MIN:MAX -----------------------------------------------------------------------------------

    def test_round_closes_after_last_call_between_min_and_max(self, rendezvous_nodes: SimulatedNodes) -> None:
        run = rendezvous_nodes.run_id()
        nodes = rendezvous_nodes.nodes(3, run, 2, 4)
        # Closing takes last call, not join_timeout: the round must not wait for MAX nodes.
        infos = rendezvous_nodes.rendezvous_all(nodes, self.last_call_timeout + self.rendezvous_slack)
        assert [info.group_world_size for info in infos] == [3, 3, 3], "the round must admit every node of last call"
        assert sorted(info.group_rank for info in infos) == [0, 1, 2]

    def test_round_closes_at_once_when_max_nodes_join(self, rendezvous_nodes: SimulatedNodes) -> None:
        run = rendezvous_nodes.run_id()
        long_last_call = 3 * self.rendezvous_slack
        nodes = rendezvous_nodes.nodes(2, run, 1, 2, last_call_timeout=long_last_call)
        infos = rendezvous_nodes.rendezvous_all(nodes, self.rendezvous_slack)
        assert sorted(info.group_rank for info in infos) == [0, 1]

    def test_late_node_waits_and_is_counted(self, rendezvous_nodes: SimulatedNodes) -> None:
        run = rendezvous_nodes.run_id()
        first, second = rendezvous_nodes.nodes(2, run, 2, 3)
        before = rendezvous_nodes.rendezvous_all([first, second], self.last_call_timeout + self.rendezvous_slack)
        assert [info.group_world_size for info in before] == [2, 2]
        assert first.handler.num_nodes_waiting() == 0
        late = rendezvous_nodes.node(run, 2, 3).start()
        counted = _wait_for(
            lambda: first.handler.num_nodes_waiting() >= 1 and second.handler.num_nodes_waiting() >= 1,
            self.rendezvous_slack,
        )
        assert counted, "a node waiting to join a round with room was not counted by num_nodes_waiting"
        assert not late.done(), "the late node must wait for the next round"
        after = rendezvous_nodes.rendezvous_all([first, second], self.last_call_timeout + self.rendezvous_slack)
        joined = late.result(self.rendezvous_slack)
        infos = [*after, joined]
        assert sorted(info.group_rank for info in infos) == [0, 1, 2]
        assert {info.group_world_size for info in infos} == {3}
        assert joined.round > before[0].round

    # -- liveness ----------------------------------------------------------------------------------

    def test_lost_node_is_reported_within_the_heartbeat_timeout(
        self, rendezvous_nodes: SimulatedNodes, rendezvous_backend: RendezvousBackend
    ) -> None:
        run = rendezvous_nodes.run_id()
        process: NodeProcess | None = None
        if self._uses_process(rendezvous_backend):
            process = rendezvous_nodes.process(run, 3, 3)
            survivors = rendezvous_nodes.nodes(2, run, 3, 3)
            infos = rendezvous_nodes.rendezvous_all(survivors, self.rendezvous_slack)
            report = process.result(self.rendezvous_slack)
            dead_rank = int(report["group_rank"])
            victim: SimulatedNode | None = None
        else:
            nodes = rendezvous_nodes.nodes(3, run, 3, 3)
            all_infos = rendezvous_nodes.rendezvous_all(nodes, self.rendezvous_slack)
            victim = next(n for n, info in zip(nodes, all_infos, strict=True) if info.group_rank == 1)
            survivors = [n for n in nodes if n is not victim]
            infos = [info for n, info in zip(nodes, all_infos, strict=True) if n is not victim]
            dead_rank = 1
        participants = infos[0].participants
        dead_id = participants[dead_rank] if participants else None

        # Healthy nodes are never reported, however long they run.
        time.sleep(self.heartbeat_timeout * 1.5)
        assert [node.handler.lost_nodes() for node in survivors] == [[], []], "a healthy node was reported lost"

        silenced_at = time.monotonic()
        if process is not None:
            process.kill()
        else:
            assert victim is not None
            victim.silence()
        limit = self.heartbeat_timeout + self.detection_slack
        seen = _wait_for(lambda: all(node.handler.lost_nodes() for node in survivors), limit, interval=0.1)
        elapsed = time.monotonic() - silenced_at
        assert seen, f"the silent node was not reported by every survivor within {limit:g} s"
        for node in survivors:
            lost = node.handler.lost_nodes()
            if dead_id is not None:
                assert lost == [dead_id], f"lost_nodes() should name only {dead_id!r}, got {lost}"
            else:
                assert len(lost) == 1
        assert elapsed <= limit

        # The job replaces the dead node: the survivors and a new node form the next round.
        newcomer = rendezvous_nodes.node(run, 3, 3)
        again = rendezvous_nodes.rendezvous_all([*survivors, newcomer], self.rendezvous_slack)
        assert sorted(info.group_rank for info in again) == [0, 1, 2]
        if dead_id is not None and again[0].participants:
            assert dead_id not in again[0].participants

    # -- closing, timeouts -------------------------------------------------------------------------

    def test_closed_rendezvous_raises(self, rendezvous_nodes: SimulatedNodes) -> None:
        run = rendezvous_nodes.run_id()
        nodes = rendezvous_nodes.nodes(2, run, 2, 2)
        rendezvous_nodes.rendezvous_all(nodes, self.rendezvous_slack)
        nodes[0].handler.set_closed()
        assert nodes[0].handler.is_closed()
        assert _wait_for(nodes[1].handler.is_closed, self.rendezvous_slack), "the other node never saw the close"
        error = nodes[1].start().error(self.rendezvous_slack)
        assert isinstance(error, RendezvousClosedError), f"expected RendezvousClosedError, got {error!r}"
        newcomer = rendezvous_nodes.node(run, 2, 2)
        error = newcomer.start().error(self.rendezvous_slack)
        assert isinstance(error, RendezvousClosedError), f"a node joining a closed run got {error!r}"

    def test_closing_wakes_a_waiting_node(self, rendezvous_nodes: SimulatedNodes) -> None:
        run = rendezvous_nodes.run_id()
        waiting = rendezvous_nodes.node(run, 2, 2).start()
        time.sleep(0.5)
        assert not waiting.done()
        rendezvous_nodes.node(run, 2, 2).handler.set_closed()
        error = waiting.error(self.rendezvous_slack)
        assert isinstance(error, RendezvousClosedError), f"expected RendezvousClosedError, got {error!r}"

    def test_join_timeout(self, rendezvous_nodes: SimulatedNodes) -> None:
        run = rendezvous_nodes.run_id()
        alone = rendezvous_nodes.node(run, 2, 2, join_timeout=2)
        started = time.monotonic()
        error = alone.start().error(2 + self.rendezvous_slack)
        assert isinstance(error, RendezvousTimeoutError), f"expected RendezvousTimeoutError, got {error!r}"
        assert time.monotonic() - started >= 1.5

    # -- isolation ---------------------------------------------------------------------------------

    def test_run_ids_do_not_mix(self, rendezvous_nodes: SimulatedNodes) -> None:
        base = rendezvous_nodes.run_id()
        runs = [base, base + "1", base + "/1"]  # prefixes of one another, on purpose
        nodes = {run: rendezvous_nodes.nodes(2, run, 2, 2) for run in runs}
        everyone = [node for run in runs for node in nodes[run]]
        joined = rendezvous_nodes.rendezvous_all(everyone, self.rendezvous_slack)
        infos = {id(node): info for node, info in zip(everyone, joined, strict=True)}
        names: dict[str, set[str]] = {}
        for run in runs:
            mine = [infos[id(node)] for node in nodes[run]]
            assert sorted(info.group_rank for info in mine) == [0, 1], f"run {run!r} mixed with another run"
            assert {info.group_world_size for info in mine} == {2}
            names[run] = set(mine[0].participants)
        if all(names.values()):
            assert not (names[runs[0]] & names[runs[1]]) and not (names[runs[0]] & names[runs[2]])
        nodes[base][0].handler.set_closed()
        assert not nodes[runs[1]][0].handler.is_closed(), "closing one run closed another"
        assert not nodes[runs[2]][0].handler.is_closed(), "closing one run closed another"


class StoreBackendConformance(KeyValueStoreConformance, RendezvousBackendConformance):
    """Both suites for a store-only backend (``RendezvousBackend(create_store=...)``).

    The store suite runs against the backend's own ``create_store``, the rendezvous suite against
    the core's algorithm over it: a backend that passes needs no rendezvous code of its own.
    """

    @pytest.fixture
    def kv_store_factory(
        self,
        rendezvous_backend: RendezvousBackend,
        rendezvous_endpoint: str,
        rendezvous_config: dict[str, str],
    ) -> StoreFactory:
        """New clients through the backend's ``create_store``."""
        create_store = rendezvous_backend.create_store
        assert create_store is not None, f"{rendezvous_backend.name!r} provides a handler, not a store"
        nodes = SimulatedNodes(rendezvous_backend, rendezvous_endpoint, {**self.timing_config(), **rendezvous_config})
        params = nodes.params(nodes.run_id(), 1, 1)
        return lambda: create_store(params)

    def test_backend_is_store_only(self, rendezvous_backend: RendezvousBackend) -> None:
        assert rendezvous_backend.create_store is not None and rendezvous_backend.create_handler is None
