"""Simulated rendezvous nodes: handlers joining rounds on threads, or in processes that can die.

Each :class:`SimulatedNode` is a handler built the way the agent builds it (the backend's own
handler, or the core's algorithm over the backend's store) and joins rounds on a thread of its
own (:class:`PendingRendezvous`). A node that must die is either cut off from the store
(store-only backends: :class:`SeverableStore`) or runs in a forked process that is SIGKILLed (any
backend: :class:`NodeProcess`). :class:`SimulatedNodes` makes them and cleans up after them.
The tests that use them are :mod:`launcher.testing.rendezvous_suite`.
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
from typing import Any

import pytest

from launcher.plugins.types import RendezvousBackend
from launcher.rendezvous.api import RendezvousHandler, RendezvousInfo, RendezvousParameters
from launcher.store.api import KeyValueStore, StoreError

__all__ = [
    "NodeProcess",
    "PendingRendezvous",
    "SeverableStore",
    "SimulatedNode",
    "SimulatedNodes",
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
