"""Sharing each node's outcome through the store (launcher.agent.outcome), over a real server."""

from __future__ import annotations

import threading
import time

from launcher.agent.outcome import NodeOutcome, collect_outcomes, outcome_prefix, publish_outcome
from launcher.store.client import TCPStoreClient
from launcher.store.server import StoreServer


def test_records_round_trip_and_collect_waits_for_every_node() -> None:
    with StoreServer("127.0.0.1", 0) as server:
        prefix = outcome_prefix("job", 3)
        first = TCPStoreClient("127.0.0.1", server.port, timeout=10)
        second = TCPStoreClient("127.0.0.1", server.port, timeout=10)
        root = {"node": "a", "rank": 1}
        publish_outcome(first, prefix, NodeOutcome(0, "a", "10.0.0.1", root=root))
        late = threading.Timer(0.3, publish_outcome, (second, prefix, NodeOutcome(1, "b", reason="SIGTERM")))
        late.start()
        found = collect_outcomes(first, prefix, 2, until=lambda f: len(f) == 2, timeout=30)
        late.join()
        assert found[0].root == root and found[0].label == "a (node 0, 10.0.0.1)"
        assert found[1].reason == "SIGTERM" and found[1].label == "b (node 1)"
        first.close()
        second.close()


def test_collect_does_not_wait_for_lost_nodes() -> None:
    with StoreServer("127.0.0.1", 0) as server:
        store = TCPStoreClient("127.0.0.1", server.port, timeout=10)
        prefix = outcome_prefix("job", 0)
        publish_outcome(store, prefix, NodeOutcome(0, "a"))
        started = time.monotonic()
        found = collect_outcomes(store, prefix, 2, until=lambda f: len(f) == 2, lost=lambda: {1}, timeout=60)
        assert list(found) == [0]
        assert time.monotonic() - started < 60  # returned because node 1 is lost, not by timing out
        store.close()


def test_a_garbled_record_is_ignored() -> None:
    assert NodeOutcome.decode(b"not json") is None
    assert NodeOutcome.decode(NodeOutcome(2, "c").encode()) == NodeOutcome(2, "c")
