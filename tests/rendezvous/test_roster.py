"""A round costs each node O(1) store bytes: the participants list is read only when used.

Real :class:`DynamicRendezvousHandler` nodes join rounds of a crowd (the simulated nodes of
benchmarks/bench_scale.py) on launcher's store server, each over a store wrapper that counts the
requests it sends and the bytes the store returns to it. A node that is not the closer must
receive as many bytes in a round of 200 nodes as in one of 50; its participants list, read on
first use, must then match the ranks :func:`~launcher.rendezvous.rounds.sealed_value` gives.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

import pytest
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.dynamic import DynamicRendezvousHandler
from launcher.rendezvous.keys import RendezvousKeys
from launcher.rendezvous.membership import Roster, decode
from launcher.rendezvous.rounds import sealed_value
from launcher.store.api import KeyValueStore
from launcher.store.client import TCPStoreClient
from launcher.store.server import StoreServer
from launcher.testing.crowd import Crowd

from .conftest import run_beside

pytestmark = pytest.mark.timeout(300)

REAL = 2
LWS = 4


class CountingStore:
    """A store that counts the calls made through it and the bytes of the values they return."""

    def __init__(self, store: KeyValueStore) -> None:
        self.store = store
        self.calls: Counter[str] = Counter()
        self.received = 0
        #: Set on each ``compare_set`` of a ``sealed`` key: whether the roster and places existed.
        self.on_seal: list[bool] = []

    def _note(self, name: str, values: Sequence[bytes]) -> None:
        self.calls[name] += 1
        self.received += sum(len(v) for v in values)

    def set(self, key: str, value: bytes) -> None:
        self._note("set", [])
        self.store.set(key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        value = self.store.get(key, timeout)
        self._note("get", [value])
        return value

    def add(self, key: str, amount: int) -> int:
        self._note("add", [])
        return self.store.add(key, amount)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        if key.endswith("/sealed") and b'"sealed"' in desired:
            base = key[: -len("sealed")]
            self.on_seal.append(self.store.check([base + "roster", base + "place/1"]))
        value = self.store.compare_set(key, expected, desired)
        self._note("compare_set", [value])
        return value

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        values = self.store.multi_get(keys, timeout)
        self._note("multi_get", values)
        return values

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        self._note("multi_set", [])
        self.store.multi_set(keys, values)

    def check(self, keys: Sequence[str]) -> bool:
        self._note("check", [])
        return self.store.check(keys)

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        self._note("wait", [])
        self.store.wait(keys, timeout)

    def delete(self, key: str) -> bool:
        self._note("delete", [])
        return self.store.delete(key)

    def close(self) -> None:
        self.store.close()


def _requests(store: CountingStore) -> Counter[str]:
    """The requests ``store`` counted, but the heartbeat's adds (its thread beats meanwhile)."""
    return Counter({name: count for name, count in store.calls.items() if name != "add"})


def _handler(port: int, run_id: str, n: int) -> tuple[DynamicRendezvousHandler, CountingStore]:
    store = CountingStore(TCPStoreClient("127.0.0.1", port, timeout=120))
    config = DynamicRendezvousConfig(join_timeout=240, last_call_timeout=30, read_timeout=120)
    handler = DynamicRendezvousHandler(
        store, run_id=run_id, min_nodes=n, max_nodes=n, config=config, local_addr="127.0.0.1", local_world_size=LWS
    )
    return handler, store


Made = list[tuple[DynamicRendezvousHandler, CountingStore]]


def _round_with_crowd(n: int) -> tuple[list[object], Made, Crowd, dict[str, object]]:
    """``REAL`` counted real nodes, then a crowd of ``n - REAL`` (whose last node closes), form a
    round; the real nodes' infos, their handlers and stores (counts taken right after joining),
    the crowd, and the round's roster as stored. The handlers are shut down on return."""
    run_id = f"roster-{n}"
    keys = RendezvousKeys(run_id)
    with StoreServer("127.0.0.1", 0, clients=n + 8) as server:
        made = [_handler(server.port, run_id, n) for _ in range(REAL)]
        infos: list[object] = [None] * REAL
        counts: list[tuple[Counter[str], int]] = [(Counter(), 0)] * REAL
        errors: list[BaseException] = []

        def real(i: int) -> None:
            handler, store = made[i]
            try:
                infos[i] = handler.next_rendezvous()
                counts[i] = (Counter(store.calls), store.received)
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=real, args=(i,), daemon=True) for i in range(REAL)]
        for thread in threads:
            thread.start()
        with TCPStoreClient("127.0.0.1", server.port, timeout=60) as probe:
            # The real nodes take join indexes 1 and 2 before the crowd joins: a crowd node closes.
            probe.wait([keys.node(0, k) for k in range(1, REAL + 1)], 60)
        crowd = Crowd("127.0.0.1", server.port, run_id, nodes=n, first=0, count=n - REAL, local_world_size=LWS)

        try:
            run_beside(crowd, threads, errors)
            roster = decode(server.store.get(keys.roster(0)))
            records = [decode(raw) for raw in server.store.multi_get([keys.node(0, k) for k in range(1, n + 1)])]
            # Read the participants through the handlers while their store is up.
            for info, (handler, store) in zip(infos, made, strict=True):
                before = _requests(store)
                assert len(info.participants) == n  # type: ignore[attr-defined]
                assert info.participants[info.group_rank] == handler.node.id  # type: ignore[attr-defined]
                assert _requests(store) == before  # the length and its own id: no read
                assert list(info.participants) == roster["ids"]  # type: ignore[attr-defined]
                assert list(info.local_world_sizes) == [LWS] * n  # type: ignore[attr-defined]
                assert _requests(store) - before == Counter(get=1, wait=1)  # one read of the roster, kept
            expected = sealed_value(records, n, n, stable_rank0=False, closer=str(roster["closer"]))
            assert roster["ids"] == expected["ids"]
            for i in range(REAL):
                made[i][1].calls, made[i][1].received = counts[i]
        finally:
            for handler, _ in made:
                handler.shutdown()
    return infos, made, crowd, roster


def test_a_node_receives_as_many_bytes_in_a_round_of_200_as_in_one_of_50() -> None:
    _, small, _, _ = _round_with_crowd(50)
    large_infos, large, crowd, roster = _round_with_crowd(200)
    for (_, before), (_, after) in zip(small, large, strict=True):
        # Same requests; the values differ only in the digits of a rank and a count.
        assert _requests(before) == _requests(after)
        assert after.received <= before.received + 32, (before.received, after.received)
        assert not after.on_seal  # a crowd node closed: these nodes never read every record
    # Ranks and the world size agree with the roster the closer wrote.
    ids = list(roster["ids"])  # type: ignore[call-overload]
    for info, (handler, _) in zip(large_infos, large, strict=True):
        rank = ids.index(handler.node.id)
        assert info.group_rank == rank  # type: ignore[attr-defined]
        last = handler._last
        assert last is not None and last.world_size == LWS * 200
    assert sorted(crowd.ranks + [i.group_rank for i in large_infos]) == list(range(200))  # type: ignore[attr-defined]


def test_the_closer_writes_the_roster_and_places_before_sealed() -> None:
    n = 3
    with StoreServer("127.0.0.1", 0) as server:
        made = [_handler(server.port, "roster-closer", n) for _ in range(n)]
        infos: list[object] = [None] * n
        errors: list[BaseException] = []

        def real(i: int) -> None:
            try:
                infos[i] = made[i][0].next_rendezvous()
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=real, args=(i,), daemon=True) for i in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        try:
            assert not errors, errors
            seals = [seen for _, store in made for seen in store.on_seal]
            assert seals and all(seals)  # the closer (or a backup) found both written already
            assert sorted(i.group_rank for i in infos) == [0, 1, 2]  # type: ignore[attr-defined]
            assert all(i.participants == infos[0].participants for i in infos)  # type: ignore[attr-defined]
        finally:
            for handler, _ in made:
                handler.shutdown()


def test_a_roster_reads_once_and_needs_no_read_for_what_it_knows() -> None:
    reads: list[int] = []

    def load() -> list[str]:
        reads.append(1)
        return ["a", "b", "c"]

    roster = Roster(3, load, {1: "b"})
    assert len(roster) == 3 and roster[1] == "b" and roster[-2] == "b" and not reads
    assert "c" in roster and roster == ["a", "b", "c"] and list(roster) == ["a", "b", "c"]
    assert reads == [1] and roster.loaded


def test_a_roster_that_reads_the_wrong_length_is_an_error() -> None:
    from launcher.rendezvous.api import RendezvousError

    with pytest.raises(RendezvousError, match="2 entries, not 3"):
        list(Roster(3, lambda: ["a", "b"]))
