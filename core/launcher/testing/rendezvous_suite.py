"""Conformance suite for rendezvous backends, with simulated nodes.

Nodes are simulated in the test process: each :class:`SimulatedNode` is a handler built the way
the agent builds it (the backend's own handler, or the core's algorithm over the backend's
store) and joins rounds on a thread of its own. A node that must die is either cut off from the
store (store-only backends: :class:`SeverableStore`) or runs in a forked process that is
SIGKILLed (any backend: :class:`NodeProcess`).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import RendezvousBackend
from launcher.rendezvous.api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from launcher.store.api import KeyValueStore, StoreError
from launcher.testing.plugin_suite import PluginModuleConformance
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

_CLOSE_WAIT = 10.0


def create_handler(
    backend: RendezvousBackend,
    params: RendezvousParameters,
    *,
    wrap_store: Callable[[KeyValueStore], KeyValueStore] | None = None,
) -> RendezvousHandler:
    """The handler the agent would get from ``backend``: its own, or the core's over its store.

    ``wrap_store`` may replace a store-only backend's store before the core's algorithm uses it.
    """
    from launcher.rendezvous.registry import handler_for

    return handler_for(backend, params, wrap_store=wrap_store)


class SeverableStore:
    """A :class:`~launcher.store.api.KeyValueStore` that can be cut off, as by a dead network.

    After :meth:`sever`, every call raises :class:`~launcher.store.api.StoreError` (``close``
    still closes the store underneath), so a handler over it stops heartbeating exactly as a
    node whose host died would, from the other nodes' point of view.
    """

    def __init__(self, store: KeyValueStore) -> None:
        self.inner = store
        self.severed = False

    def sever(self) -> None:
        """Cut the store off: every later call fails."""
        self.severed = True

    def _live(self) -> KeyValueStore:
        if self.severed:
            raise StoreError("the store was severed by the test (a simulated dead node)")
        return self.inner

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``."""
        self._live().set(key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists."""
        return self._live().get(key, timeout)

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key``; the new value."""
        return self._live().add(key, amount)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected``; the value now stored."""
        return self._live().compare_set(key, expected, desired)

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Values of several keys, waiting until all exist."""
        return self._live().multi_get(keys, timeout)

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set several keys at once."""
        self._live().multi_set(keys, values)

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, without waiting."""
        return self._live().check(keys)

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key exists."""
        self._live().wait(keys, timeout)

    def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        return self._live().delete(key)

    def close(self) -> None:
        """Close the store underneath, severed or not."""
        self.inner.close()


class PendingRendezvous:
    """A ``next_rendezvous`` call running on a thread of its own."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self._info: RendezvousInfo | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"rdzv-{node.label}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._info = self.node.handler.next_rendezvous()
        except BaseException as exc:  # handed to result()
            self._error = exc

    def done(self) -> bool:
        """Whether the call returned or raised."""
        return not self._thread.is_alive()

    def result(self, timeout: float) -> RendezvousInfo:
        """The call's result (its exception re-raised); fails the test if it takes longer."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            pytest.fail(f"node {self.node.label}: next_rendezvous did not return within {timeout:g} s")
        if self._error is not None:
            raise self._error
        assert self._info is not None
        return self._info

    def error(self, timeout: float) -> BaseException:
        """The exception the call raised; fails the test if it returned or takes longer."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            pytest.fail(f"node {self.node.label}: next_rendezvous did not end within {timeout:g} s")
        if self._error is None:
            pytest.fail(f"node {self.node.label}: next_rendezvous returned {self._info!r} instead of raising")
        return self._error


@dataclass
class SimulatedNode:
    """One simulated node: its handler, its parameters and (store-only backends) its store."""

    label: str
    handler: RendezvousHandler
    params: RendezvousParameters
    store: SeverableStore | None = None

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round on the calling thread."""
        return self.handler.next_rendezvous()

    def start(self) -> PendingRendezvous:
        """Join the next round on a thread of its own."""
        return PendingRendezvous(self)

    def silence(self) -> None:
        """Cut this node off the store: it stops heartbeating, as if its host had died."""
        if self.store is None:
            raise RuntimeError("only nodes of a store-only backend can be silenced in-process; use a NodeProcess")
        self.store.sever()


def _process_node_main(backend: RendezvousBackend, params: RendezvousParameters, conn: Any) -> None:
    try:
        handler = create_handler(backend, params)
        info = handler.next_rendezvous()
        conn.send(
            {
                "group_rank": info.group_rank,
                "group_world_size": info.group_world_size,
                "round": info.round,
                "participants": list(info.participants),
            }
        )
    except BaseException as exc:
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    while True:  # keep heartbeating until the test kills this process
        time.sleep(60)


class NodeProcess:
    """A node in a forked process, so that it can die as a crashed host does (SIGKILL).

    The child inherits the backend registration (no pickling), builds its handler, joins one
    round, reports it, then keeps running (heartbeating) until :meth:`kill`.
    """

    def __init__(self, backend: RendezvousBackend, params: RendezvousParameters) -> None:
        context = multiprocessing.get_context("fork")
        self._reader, writer = context.Pipe(duplex=False)
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork in a threaded process; the child only runs the handler.
            warnings.simplefilter("ignore", DeprecationWarning)
            self._process = context.Process(
                target=_process_node_main, args=(backend, params, writer), name="rdzv-node-process", daemon=True
            )
            self._process.start()
        writer.close()
        self.params = params

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._process.pid

    def result(self, timeout: float) -> dict[str, Any]:
        """The round the child joined: ``group_rank``, ``group_world_size``, ``round``, ``participants``."""
        if not self._reader.poll(timeout):
            pytest.fail(f"the node process did not complete a round within {timeout:g} s")
        report: dict[str, Any] = self._reader.recv()
        if "error" in report:
            pytest.fail(f"the node process failed: {report['error']}")
        return report

    def kill(self) -> None:
        """SIGKILL the child and reap it."""
        if self._process.pid is not None and self._process.is_alive():
            os.kill(self._process.pid, signal.SIGKILL)
        self._process.join(10)
        self._reader.close()


@dataclass
class SimulatedNodes:
    """Makes simulated nodes of one backend and cleans up after them.

    ``config`` is the ``--rdzv-conf`` every node gets; :meth:`node` takes overrides. On
    :meth:`close` every run used is closed (waking nodes still waiting), every handler shut
    down and every node process killed.
    """

    backend: RendezvousBackend
    endpoint: str
    config: dict[str, str] = field(default_factory=dict)
    local_addr: str = "127.0.0.1"
    _nodes: list[SimulatedNode] = field(default_factory=list)
    _processes: list[NodeProcess] = field(default_factory=list)
    _labels: Iterator[int] = field(default_factory=itertools.count)

    def run_id(self) -> str:
        """A run id no other test uses (a shared store keeps earlier tests' keys)."""
        return f"conformance-{uuid.uuid4().hex[:12]}"

    def params(self, run_id: str, min_nodes: int, max_nodes: int, **config: Any) -> RendezvousParameters:
        """The parameters of one node; ``config`` overrides ``--rdzv-conf`` keys."""
        merged = {**self.config, **{k: str(v) for k, v in config.items()}}
        if self.backend.config_keys is not None:
            merged = {k: v for k, v in merged.items() if k in self.backend.config_keys}
        return RendezvousParameters(
            backend=self.backend.name,
            endpoint=self.endpoint,
            run_id=run_id,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            local_addr=self.local_addr,
            config=merged,
        )

    def node(self, run_id: str, min_nodes: int, max_nodes: int, **config: Any) -> SimulatedNode:
        """A new node of run ``run_id`` (``--nnodes MIN:MAX``)."""
        params = self.params(run_id, min_nodes, max_nodes, **config)
        severable: list[SeverableStore] = []

        def wrap(store: KeyValueStore) -> KeyValueStore:
            severable.append(SeverableStore(store))
            return severable[0]

        handler = create_handler(self.backend, params, wrap_store=wrap)
        node = SimulatedNode(f"{run_id}#{next(self._labels)}", handler, params, severable[0] if severable else None)
        self._nodes.append(node)
        return node

    def nodes(self, count: int, run_id: str, min_nodes: int, max_nodes: int, **config: Any) -> list[SimulatedNode]:
        """``count`` new nodes of one run."""
        return [self.node(run_id, min_nodes, max_nodes, **config) for _ in range(count)]

    def process(self, run_id: str, min_nodes: int, max_nodes: int, **config: Any) -> NodeProcess:
        """A node of run ``run_id`` in a forked process (joins its first round at once)."""
        process = NodeProcess(self.backend, self.params(run_id, min_nodes, max_nodes, **config))
        self._processes.append(process)
        return process

    def rendezvous_all(self, nodes: Sequence[SimulatedNode], timeout: float) -> list[RendezvousInfo]:
        """Every node joins the next round at once (a thread each); their infos, in node order."""
        pending = [node.start() for node in nodes]
        end = time.monotonic() + timeout
        return [p.result(max(0.0, end - time.monotonic())) for p in pending]

    def close(self) -> None:
        """Close every run, shut every handler down, kill every node process."""
        for process in self._processes:
            process.kill()
        closed: set[str] = set()
        for node in self._nodes:
            run = node.params.run_id
            if run in closed or (node.store is not None and node.store.severed):
                continue
            try:
                node.handler.set_closed()
                closed.add(run)
            except Exception:  # another node of the run may still close it
                continue
        threads = [threading.Thread(target=self._shutdown, args=(node,), daemon=True) for node in self._nodes]
        for thread in threads:
            thread.start()
        end = time.monotonic() + _CLOSE_WAIT
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))

    @staticmethod
    def _shutdown(node: SimulatedNode) -> None:
        with contextlib.suppress(Exception):  # teardown: the test's own outcome matters more
            node.handler.shutdown()


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

    kind: ClassVar[str] = "rendezvous backend"
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
        registration = self.lookup_registration(plugin_manager, self.backend_name)
        assert isinstance(registration, RendezvousBackend)
        return registration

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
