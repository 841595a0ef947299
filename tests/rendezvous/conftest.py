"""Fixtures for the rendezvous tests: a store service, simulated nodes (threads) over it.

Every algorithm test runs twice: over torch's TCPStore (server and client, through the c10d
backend's adapter) and over launcher's own pure-Python TCPStore server and client.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from launcher.rendezvous.api import RendezvousInfo
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.dynamic import DynamicRendezvousHandler
from launcher.store.api import KeyValueStore, StoreError

if TYPE_CHECKING:
    from launcher.testing.crowd import Crowd

#: Short timings: every test is bounded by a few seconds.
FAST = {
    "join_timeout": 15.0,
    "last_call_timeout": 0.5,
    "keep_alive_interval": 0.1,
    "heartbeat_timeout": 0.8,
    "read_timeout": 15.0,
}
#: Generous bound for "should happen promptly": torch's client sometimes stalls 5 s on a
#: reverse-DNS lookup while connecting on this machine.
PROMPT = 20.0


class Severable:
    """A store that can be cut off, as a dead host's would be: every call then fails."""

    def __init__(self, inner: KeyValueStore) -> None:
        self.inner = inner
        self.severed = False
        #: How many times each method was called (what a node asked of the store).
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name == "close" or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.severed:
                raise StoreError("severed by the test")
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return call


@dataclass
class StoreService:
    """A running store service and a way to open clients to it."""

    kind: str
    host: str
    port: int
    connect: Callable[[], KeyValueStore]


@pytest.fixture(params=["torch", "launcher"])
def store_service(request: pytest.FixtureRequest) -> Iterator[StoreService]:
    """torch's TCPStore, or launcher's pure-Python one, on a free loopback port."""
    if request.param == "torch":
        import torch.distributed as dist
        from launcher.rendezvous.torch_store import TorchStore

        server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
        port = int(server.port)

        def connect() -> KeyValueStore:
            return TorchStore(dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30)))

        yield StoreService("torch", "127.0.0.1", port, connect)
        del server
    else:
        server_module = pytest.importorskip("launcher.store.server")
        client_module = pytest.importorskip("launcher.store.client")
        py_server = server_module.StoreServer("127.0.0.1", 0).start()

        def connect_py() -> KeyValueStore:
            store: KeyValueStore = client_module.TCPStoreClient("127.0.0.1", py_server.port, timeout=30)
            return store

        try:
            yield StoreService("launcher", "127.0.0.1", py_server.port, connect_py)
        finally:
            py_server.close()


@dataclass
class Cluster:
    """Builds simulated nodes over one store service; closes and shuts them down afterwards."""

    service: StoreService
    handlers: list[DynamicRendezvousHandler] = field(default_factory=list)
    stores: dict[int, Severable] = field(default_factory=dict)

    def run_id(self) -> str:
        return f"test-{uuid.uuid4().hex[:10]}"

    def node(
        self,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        *,
        local_addr: str = "127.0.0.1",
        progress_interval: float = 5.0,
        **options: Any,
    ) -> DynamicRendezvousHandler:
        # ``is_host`` is a handler argument here (whether this node serves the store), not the
        # c10d backend's guess-overriding setting.
        config_keys = {
            k: options.pop(k)
            for k in list(options)
            if k in DynamicRendezvousConfig.__dataclass_fields__ and k != "is_host"
        }
        config = DynamicRendezvousConfig(**{**FAST, **config_keys})
        store = Severable(self.service.connect())
        handler = DynamicRendezvousHandler(
            store,
            run_id=run_id,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            config=config,
            local_addr=local_addr,
            progress_interval=progress_interval,
            **options,
        )
        self.handlers.append(handler)
        self.stores[id(handler)] = store
        return handler

    def nodes(
        self, count: int, run_id: str, min_nodes: int, max_nodes: int, **options: Any
    ) -> list[DynamicRendezvousHandler]:
        return [self.node(run_id, min_nodes, max_nodes, **options) for _ in range(count)]

    def sever(self, handler: DynamicRendezvousHandler) -> None:
        """Cut ``handler`` off the store: it stops heartbeating, as a dead host would."""
        self.stores[id(handler)].severed = True

    def close(self) -> None:
        for handler in self.handlers:
            if not self.stores[id(handler)].severed:
                with contextlib.suppress(Exception):
                    handler.set_closed()
        threads = [threading.Thread(target=h.shutdown, daemon=True) for h in self.handlers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)


class Pending:
    """``next_rendezvous`` on a thread of its own."""

    def __init__(self, handler: DynamicRendezvousHandler) -> None:
        self.handler = handler
        self.info: RendezvousInfo | None = None
        self.error: BaseException | None = None
        self.finished_at: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.info = self.handler.next_rendezvous()
        except BaseException as exc:  # handed to the test
            self.error = exc
        self.finished_at = time.monotonic()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = PROMPT) -> RendezvousInfo:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"next_rendezvous did not return within {timeout:g} s"
        if self.error is not None:
            raise self.error
        assert self.info is not None
        return self.info

    def exception(self, timeout: float = PROMPT) -> BaseException:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"next_rendezvous did not end within {timeout:g} s"
        assert self.error is not None, f"next_rendezvous returned {self.info!r} instead of raising"
        return self.error


def rendezvous_all(handlers: list[DynamicRendezvousHandler], timeout: float = PROMPT) -> list[RendezvousInfo]:
    """Every handler joins the next round at once; their infos, in handler order."""
    pending = [Pending(h) for h in handlers]
    end = time.monotonic() + timeout
    return [p.result(max(0.0, end - time.monotonic())) for p in pending]


def run_beside(crowd: Crowd, threads: list[threading.Thread], errors: list[BaseException], steady: float = 0.0) -> None:
    """Run ``crowd`` through one round beside real nodes, each joining in one of ``threads``
    (those not started yet start once the crowd is connected), then ``steady`` seconds of the
    crowd's steady load; wait for the threads and fail with what they raised (``errors``)."""

    async def simulate() -> None:
        try:
            await crowd.connect()
            for thread in threads:
                if thread.ident is None:
                    thread.start()
            await crowd.join()
            if steady:
                await crowd.steady(steady)
        finally:
            crowd.close()

    asyncio.run(simulate())
    for thread in threads:
        thread.join(120)
    assert not errors, errors


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= end:
            return False
        time.sleep(interval)
    return True


@pytest.fixture
def cluster(store_service: StoreService) -> Iterator[Cluster]:
    nodes = Cluster(store_service)
    yield nodes
    nodes.close()
