"""EtcdStore against a real etcd: every operation, waits by watch, leases, exactly-once adds."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from etcd_helpers import make_store
from etcd_servers import EtcdCluster
from launcher.store.api import KeyValueStore, StoreTimeoutError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def stores(shared_etcd: EtcdCluster) -> Iterator[Callable[..., Any]]:
    """``stores(**options)``: EtcdStores under one fresh prefix; all closed afterwards."""
    prefix = f"/store-test/{uuid.uuid4().hex[:8]}/"
    opened: list[Any] = []

    def make(**options: Any) -> Any:
        opened.append(make_store(shared_etcd.endpoint, prefix, **options))
        return opened[-1]

    yield make
    for store in opened:
        store.close(revoke=True)


def later(delay: float, fn: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        fn()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_is_a_key_value_store_and_sets_gets_deletes(stores: Callable[..., Any]) -> None:
    store = stores()
    assert isinstance(store, KeyValueStore)
    store.set("a", b"1")
    store.set("empty", b"")
    store.set("bin", bytes(range(256)))
    assert store.get("a") == b"1" and store.get("empty") == b"" and store.get("bin") == bytes(range(256))
    store.set("a", b"2")
    assert store.get("a") == b"2"
    assert store.delete("a") is True
    assert store.delete("a") is False
    assert store.check(["empty", "bin"]) and not store.check(["empty", "a"])


def test_keys_live_under_the_prefix_only(stores: Callable[..., Any], shared_etcd: EtcdCluster) -> None:
    store = stores()
    other = make_store(shared_etcd.endpoint, f"/store-test/{uuid.uuid4().hex[:8]}/")
    try:
        store.set("k", b"mine")
        assert not other.check(["k"])
        other.set("k", b"theirs")
        assert store.get("k") == b"mine"
    finally:
        other.close(revoke=True)


def test_add_counts_exactly_and_reads_back_as_decimal(stores: Callable[..., Any]) -> None:
    store = stores()
    assert store.add("n", 0) == 0 and not store.check(["n"])  # reading does not create
    assert [store.add("n", 1) for _ in range(3)] == [1, 2, 3]
    assert store.add("n", -5) == -2
    assert store.add("n", 1 << 40) == (1 << 40) - 2
    assert store.get("n") == str((1 << 40) - 2).encode()
    assert store.multi_get(["n"]) == [str((1 << 40) - 2).encode()]
    store.set("d", b"41")  # a decimal written by set is a counter too, as in TCPStore
    assert store.add("d", 1) == 42 and store.get("d") == b"42"
    store.set("text", b"abc")
    with pytest.raises(Exception, match="not an integer"):
        store.add("text", 1)


def test_concurrent_adds_from_many_clients_lose_nothing(stores: Callable[..., Any]) -> None:
    clients = [stores() for _ in range(8)]
    results: list[int] = []
    lock = threading.Lock()

    def work(store: Any) -> None:
        for _ in range(25):
            value = store.add("hits", 1)
            with lock:
                results.append(value)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == list(range(1, 201))  # every add saw a distinct value: none lost, none doubled
    assert clients[0].get("hits") == b"200"


def test_compare_set_follows_tcpstore(stores: Callable[..., Any]) -> None:
    store = stores()
    assert store.compare_set("k", b"", b"v1") == b"v1"  # missing and expected empty: set
    assert store.compare_set("k", b"", b"v2") == b"v1"  # present: expected empty does not match
    assert store.compare_set("k", b"nope", b"v2") == b"v1"
    assert store.compare_set("k", b"v1", b"v2") == b"v2"
    assert store.get("k") == b"v2"
    # Missing with a non-empty expectation: torch answers `expected` and stores nothing.
    assert store.compare_set("missing", b"e", b"d") == b"e" and not store.check(["missing"])
    store.add("c", 7)  # a counter compares by its value
    assert store.compare_set("c", b"7", b"done") == b"done"


def test_multi_set_and_multi_get_beyond_one_transaction(stores: Callable[..., Any]) -> None:
    store = stores()
    keys = [f"m/{i}" for i in range(300)]  # more than etcd's 128 operations per transaction
    store.multi_set(keys, [str(i).encode() for i in range(300)])
    assert store.multi_get(keys) == [str(i).encode() for i in range(300)]
    store.multi_set(["x", "y", "x"], [b"1", b"2", b"3"])  # the same key twice: the last wins
    assert store.multi_get(["x", "y"]) == [b"3", b"2"]
    assert store.check(keys)


def test_get_wait_and_multi_get_wake_on_a_write_from_another_client(stores: Callable[..., Any]) -> None:
    waiter, writer = stores(), stores()
    start = time.monotonic()
    later(0.3, lambda: writer.set("late", b"L"))
    assert waiter.get("late", timeout=10) == b"L"
    assert time.monotonic() - start < 2.0
    later(0.2, lambda: writer.set("w1", b"1"))
    later(0.4, lambda: writer.set("w2", b"2"))
    start = time.monotonic()
    waiter.wait(["w1", "w2"], timeout=10)
    later(0.2, lambda: writer.multi_set(["g1", "g2"], [b"a", b"b"]))
    assert waiter.multi_get(["w1", "g1", "g2"], timeout=10) == [b"1", b"a", b"b"]
    assert time.monotonic() - start < 3.0


def test_waiting_is_one_watch_not_polling(stores: Callable[..., Any]) -> None:
    store = stores()
    client = store.client
    calls: list[str] = []
    watches: list[int] = []
    request, watch = client.request, client.watch_puts

    def counted_request(path: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(path)
        return request(path, *args, **kwargs)

    def counted_watch(*args: Any, **kwargs: Any) -> Any:
        watches.append(1)
        return watch(*args, **kwargs)

    client.request, client.watch_puts = counted_request, counted_watch
    start = time.monotonic()
    with pytest.raises(StoreTimeoutError, match="never"):
        store.wait(["never"], timeout=2.0)
    elapsed = time.monotonic() - start
    assert 1.9 < elapsed < 3.0
    # One read, one watch that waits out the 2 s, one read to confirm: no polling loop.
    assert len(watches) == 1 and len(calls) <= 3, (calls, watches)
    with pytest.raises(StoreTimeoutError):
        store.get("never", timeout=0.2)


def test_owned_keys_vanish_when_the_owner_stops_renewing(stores: Callable[..., Any]) -> None:
    owner = stores(lease_ttl=2, owned=lambda key: key.startswith("mine/"))
    observer = stores()
    owner.set("mine/record", b"alive")
    owner.add("mine/beat", 1)
    owner.set("shared", b"stays")
    assert observer.check(["mine/record", "mine/beat"])
    # The owner "dies": its keeper stops and nothing else talks for it.
    owner.lease.stop()
    start = time.monotonic()
    while observer.check(["mine/record"]) or observer.check(["mine/beat"]):
        assert time.monotonic() - start < 6, "owned keys outlived their lease"
        time.sleep(0.1)
    assert time.monotonic() - start >= 0.5  # they outlived the owner by most of the TTL
    assert observer.get("shared") == b"stays"  # shared keys carry no lease


def test_a_live_owner_keeps_its_keys_past_the_ttl_and_close_does_not_delete_them(stores: Callable[..., Any]) -> None:
    owner = stores(lease_ttl=2, owned=lambda key: key.startswith("mine/"))
    observer = stores()
    owner.set("mine/record", b"alive")
    time.sleep(3.0)  # past the TTL: the keeper renews it
    assert observer.get("mine/record") == b"alive"
    owner.close()  # a clean exit leaves them readable until the TTL ends (see EtcdStore)
    assert observer.check(["mine/record"])
    revoking = stores(lease_ttl=2, owned=lambda key: key.startswith("mine/"))
    revoking.set("mine/other", b"x")
    revoking.close(revoke=True)
    assert not observer.check(["mine/other"])


def test_a_lost_lease_is_replaced_and_the_keys_restored(stores: Callable[..., Any]) -> None:
    owner = stores(lease_ttl=3, owned=lambda key: key.startswith("mine/"))
    observer = stores()
    owner.set("mine/record", b"alive")
    assert owner.add("mine/beat", 5) == 5
    lease = owner.lease.granted
    observer.client.revoke_lease(lease)  # as if etcd had been out of reach for longer than the TTL
    assert not observer.check(["mine/record"])
    start = time.monotonic()
    while not observer.check(["mine/record", "mine/beat"]):
        assert time.monotonic() - start < 5, "the keeper did not restore the keys"
        time.sleep(0.1)
    assert owner.lease.granted != lease
    assert observer.get("mine/record") == b"alive" and observer.get("mine/beat") == b"5"
    assert owner.add("mine/beat", 1) == 6
    # A write that meets the dead lease renews it on the spot.
    observer.client.revoke_lease(owner.lease.granted)
    owner.set("mine/record", b"again")
    assert observer.get("mine/record") == b"again"


def test_an_add_is_not_applied_twice_when_the_answer_is_lost(stores: Callable[..., Any]) -> None:
    from launcher_etcd import client as client_module

    store = stores()
    assert store.add("once", 1) == 1
    real_post = store.client._post
    lost = {"txn": 0}

    def post_then_lose_answer(index: int, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        answer = real_post(index, path, payload)
        if path == "/kv/txn" and lost["txn"] == 0:
            lost["txn"] += 1  # the write happened, but the client never hears of it
            raise client_module._Transient("connection reset", sent=True)
        return answer

    store.client._post = post_then_lose_answer
    assert store.add("once", 1) == 2
    assert lost["txn"] == 1
    assert store.get("once") == b"2"
