"""The asyncio crowd (benchmarks/bench_scale.py's nodes) forms rounds with real handlers.

Real :class:`DynamicRendezvousHandler` nodes and simulated ones join one round on launcher's
store server: if the crowd spoke the protocol differently from the real algorithm, the round
would not form, or the two would disagree on ranks and participants. Structure only, no timings.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable

import pytest
from launcher.rendezvous import membership
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.dynamic import DynamicRendezvousHandler
from launcher.rendezvous.keys import RendezvousKeys
from launcher.store.client import TCPStoreClient
from launcher.store.protocol import QueryType
from launcher.store.server import StoreServer
from launcher.testing.crowd import Crowd, CrowdClient

from .conftest import run_beside

pytestmark = pytest.mark.timeout(300)

CROWD = 300
REAL = 3


def _real_handlers(server: StoreServer, run_id: str, n: int) -> list[DynamicRendezvousHandler]:
    config = DynamicRendezvousConfig(join_timeout=240, last_call_timeout=30, read_timeout=120)
    return [
        DynamicRendezvousHandler(
            TCPStoreClient("127.0.0.1", server.port, timeout=120),
            run_id=run_id,
            min_nodes=n,
            max_nodes=n,
            config=config,
            local_addr="127.0.0.1",
        )
        for _ in range(REAL)
    ]


@pytest.mark.parametrize("compressed", [False, True], ids=["json", "compressed"])
def test_a_crowd_and_real_nodes_form_one_round(monkeypatch: pytest.MonkeyPatch, compressed: bool) -> None:
    if compressed:  # a round this size stores its roster as JSON; make it take the large rounds' path
        monkeypatch.setattr(membership, "COMPRESS_OVER", 1024)
    n = CROWD + REAL
    run_id = f"crowd-{compressed}"
    with StoreServer("127.0.0.1", 0, clients=n + 8) as server:
        handlers = _real_handlers(server, run_id, n)
        infos: list[object] = [None] * REAL
        errors: list[BaseException] = []

        def real(i: int) -> None:
            try:
                infos[i] = handlers[i].next_rendezvous()
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=real, args=(i,), daemon=True) for i in range(REAL)]
        crowd = Crowd("127.0.0.1", server.port, run_id, nodes=n, first=0, count=CROWD)

        try:
            run_beside(crowd, threads, errors, steady=1.5)
            ranks = sorted(crowd.ranks + [info.group_rank for info in infos])  # type: ignore[attr-defined]
            assert ranks == list(range(n))
            participants = [info.participants for info in infos]  # type: ignore[attr-defined]
            assert all(p == participants[0] for p in participants)
            assert len(participants[0]) == n
            ids = {crowd.descriptor(k).id for k in range(CROWD)}
            assert ids <= set(participants[0])
            for info in infos:
                assert info.group_world_size == n  # type: ignore[attr-defined]
                assert info.local_world_sizes == []  # the real nodes did not say theirs  # type: ignore[attr-defined]
            raw = server.store.get(RendezvousKeys(run_id).roster(0))
            assert (raw[:1] == b"\x78") is compressed
            assert server.store.get(RendezvousKeys(run_id).sealed(0))[:1] == b"{"  # small: never compressed
            # The steady load touched every node's heartbeat and status keys.
            assert set(crowd.latencies) >= {"add", "set", "check"}
        finally:
            for handler in handlers:
                handler.shutdown()


# -- torch's TCPStore (libuv) as the store's host: what benchmarks/bench_scale.py compares against --


def _torch_host() -> tuple[object, int]:
    dist = pytest.importorskip("torch.distributed")
    from datetime import timedelta

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    return store, int(store.port)


@pytest.mark.parametrize("host", ["torch", "launcher"])
def test_a_cancel_that_crosses_the_wakeup_leaves_the_connection_in_step(host: str) -> None:
    # A slice that ends as the key arrives: the server has sent STOP_WAITING before it reads the
    # CANCEL_WAIT, and answers that with WAIT_CANCELED too (torch: parse_cancel_wait_command in
    # TCPStoreLibUvBackend.cpp always replies). With the key set beforehand and a slice of 0 s,
    # that order is certain: the crowd's client must read both bytes and stay in step.
    server: object
    if host == "torch":
        server, port = _torch_host()
    else:
        server = StoreServer("127.0.0.1", 0).start()
        port = server.port  # type: ignore[attr-defined]
    try:
        with TCPStoreClient("127.0.0.1", port, timeout=30) as other:
            other.set("k", b"v")

        async def check() -> None:
            client = CrowdClient(wait_slice=0.0)
            await client.connect("127.0.0.1", port)
            try:
                for _ in range(20):
                    assert await client.wait(["k"], 0.0)
                    assert await client.get("k") == b"v"  # the next reply is the GET's own
                assert not await client.wait(["missing"], 0.0)  # a real cancel: WAIT_CANCELED alone
                assert await client.add("n", 2) == 2
            finally:
                client.close()

        asyncio.run(asyncio.wait_for(check(), 60))  # out of step, a read would wait for ever
    finally:
        if host == "launcher":
            server.close()  # type: ignore[attr-defined]
        del server


def _form_round(crowd: Crowd, limit: float = 240.0) -> None:
    """Connect every node of ``crowd`` and take part in one round (its ranks are then known)."""

    async def simulate() -> None:
        try:
            await crowd.connect()
            await asyncio.wait_for(crowd.join(), limit)
        finally:
            crowd.close()

    asyncio.run(simulate())


def test_a_crowd_forms_a_round_on_torchs_tcpstore() -> None:
    # Slices of 5 ms: nearly every wait ends in a cancel, many of them crossing the wakeup.
    store, port = _torch_host()
    n = 256
    crowd = Crowd("127.0.0.1", port, "crowd-torch", nodes=n, first=0, count=n, wait_slice=0.005)
    try:
        _form_round(crowd)
        assert sorted(crowd.ranks) == list(range(n))
        with TCPStoreClient("127.0.0.1", port, timeout=30) as client:
            assert client.check([RendezvousKeys("crowd-torch").master(0)])
    finally:
        del store


def test_the_host_serves_each_node_a_constant_number_of_requests() -> None:
    # What the round costs the store's host grows with the nodes, not faster: each node sends
    # compare_set, add, set, a wait for and a get of the sealed record, a get of its place, and a
    # wait for and a get of the master's address (group rank 0 sets it instead), as a real node
    # does; the closer sends one multi_get, two compare_sets (roster, sealed) and one multi_set
    # (the places) more. A slice that ended costs a cancel
    # and a new wait, nothing else. Counted on the host, by request type (structure, no timings).
    n = 256
    counts: Counter[int] = Counter()
    with StoreServer("127.0.0.1", 0, clients=n + 8) as server:
        handlers = server._requests._handlers  # the table each request is dispatched through

        def counted(query: int, handler: Callable[..., None]) -> Callable[..., None]:
            def run(*args: object) -> None:
                handler(*args)  # counted once it ran in full (not while its bytes are still arriving)
                counts[query] += 1

            return run

        for query, handler in list(handlers.items()):
            handlers[query] = counted(query, handler)
        crowd = Crowd("127.0.0.1", server.port, "crowd-count", nodes=n, first=0, count=n)
        _form_round(crowd)
    assert sorted(crowd.ranks) == list(range(n))
    rewaits = counts[QueryType.CANCEL_WAIT]
    assert {QueryType(q): c for q, c in counts.items()} == {
        QueryType.VALIDATE: n,
        QueryType.COMPARE_SET: n + 2,
        QueryType.ADD: n,
        QueryType.SET: n + 1,
        QueryType.PING: n,  # the handshake's
        QueryType.WAIT: 2 * n + rewaits,
        QueryType.GET: 3 * n - 1,
        QueryType.MULTI_GET: 1,
        QueryType.MULTI_SET: 1,
        **({QueryType.CANCEL_WAIT: rewaits} if rewaits else {}),
    }


def test_segments_cost_the_nodes_no_request_more_and_the_closer_one() -> None:
    # --segment 4 over 16 domains: the nodes before MAX count nothing; the MAX-th node counts
    # the whole segments in the records it reads to seal, closes the round (ranks consecutive per
    # domain) and writes its tally for nodes beyond MAX: one set more than a round without.
    n, domains = 256, 16
    counts: Counter[int] = Counter()
    with StoreServer("127.0.0.1", 0, clients=n + 8) as server:
        handlers = server._requests._handlers

        def counted(query: int, handler: Callable[..., None]) -> Callable[..., None]:
            def run(*args: object) -> None:
                handler(*args)
                counts[query] += 1

            return run

        for query, handler in list(handlers.items()):
            handlers[query] = counted(query, handler)
        crowd = Crowd("127.0.0.1", server.port, "crowd-segments", nodes=n, first=0, count=n, domains=domains,
                      segment=4)
        _form_round(crowd)
    assert sorted(crowd.ranks) == list(range(n))
    per_domain = n // domains
    assert all(crowd.ranks[i] // per_domain == i % domains for i in range(n))
    assert counts[QueryType.ADD] == n  # each node's join index only
    assert (counts[QueryType.MULTI_GET], counts[QueryType.MULTI_SET], counts[QueryType.COMPARE_SET]) == (1, 1, n + 2)
    assert counts[QueryType.SET] == n + 2  # the records, rank 0's master, the tally
