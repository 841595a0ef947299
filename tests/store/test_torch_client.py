"""torch's own TCPStore client against our pure-Python server: every operation it can send."""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from launcher.store.server import StoreServer

from .conftest import ServerProcess, has_ipv6_loopback

pytestmark = pytest.mark.timeout(60)


def test_set_get_and_overwrite(server_proc: ServerProcess, torch_client: Callable[..., Any]) -> None:
    store = torch_client(server_proc.host, server_proc.port)
    store.set("key", "value")
    assert store.get("key") == b"value"
    store.set("key", b"\x00\xffbinary")
    assert store.get("key") == b"\x00\xffbinary"
    store.set("empty", b"")
    assert store.get("empty") == b""
    big = bytes(range(256)) * 4096  # 1 MiB: crosses many socket reads
    store.set("big", big)
    assert store.get("big") == big


def test_values_are_shared_between_clients(
    server_proc: ServerProcess, torch_client: Callable[..., Any]
) -> None:
    a = torch_client(server_proc.host, server_proc.port)
    b = torch_client(server_proc.host, server_proc.port)
    a.set("shared", "from-a")
    assert b.get("shared") == b"from-a"


def test_get_blocks_until_another_client_sets(
    server_proc: ServerProcess, torch_client: Callable[..., Any]
) -> None:
    waiter = torch_client(server_proc.host, server_proc.port)
    setter = torch_client(server_proc.host, server_proc.port)
    timer = threading.Timer(0.2, setter.set, args=("late", "here"))
    timer.start()
    start = time.monotonic()
    assert waiter.get("late") == b"here"
    assert time.monotonic() - start >= 0.15
    timer.join()


def test_get_missing_key_times_out(
    server_proc: ServerProcess, torch_client: Callable[..., Any], dist: Any
) -> None:
    store = torch_client(server_proc.host, server_proc.port, timeout=0.3)
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="timeout"):
        store.get("never")
    assert 0.25 <= time.monotonic() - start < 5
    # The wait was cancelled cleanly: the same connection keeps working.
    store.set("after", "ok")
    assert store.get("after") == b"ok"


def test_wait_and_wait_timeout(
    server_proc: ServerProcess, torch_client: Callable[..., Any], dist: Any
) -> None:
    store = torch_client(server_proc.host, server_proc.port)
    other = torch_client(server_proc.host, server_proc.port)
    store.set("a", "1")
    store.wait(["a"])  # present: returns at once
    store.wait(["a"], datetime.timedelta(seconds=1))

    start = time.monotonic()
    with pytest.raises(dist.DistStoreError):
        store.wait(["a", "missing"], datetime.timedelta(seconds=0.3))
    assert 0.25 <= time.monotonic() - start < 5

    # Several keys: released only when the last one arrives.
    def set_later() -> None:
        time.sleep(0.1)
        other.set("k1", "x")
        time.sleep(0.1)
        other.set("k2", "y")

    thread = threading.Thread(target=set_later)
    thread.start()
    store.wait(["k1", "k2"], datetime.timedelta(seconds=10))
    thread.join()
    assert store.check(["k1", "k2"])
    # After a cancelled wait the connection stays in step.
    assert store.get("a") == b"1"


def test_wait_cancel_race_after_timeout(server_proc: ServerProcess, torch_client: Callable[..., Any]) -> None:
    # Many short waits while another client sets the keys at about the timeout: whichever of
    # STOP_WAITING and the cancel wins, the client must stay in step.
    store = torch_client(server_proc.host, server_proc.port)
    other = torch_client(server_proc.host, server_proc.port)
    for i in range(10):
        timer = threading.Timer(0.05, other.set, args=(f"race{i}", "v"))
        timer.start()
        with contextlib.suppress(Exception):  # timing out or not: both are fine here
            store.wait([f"race{i}"], datetime.timedelta(seconds=0.05))
        timer.join()
        assert store.get(f"race{i}") == b"v"


def test_check(server_proc: ServerProcess, torch_client: Callable[..., Any]) -> None:
    store = torch_client(server_proc.host, server_proc.port)
    assert not store.check(["c"])
    store.set("c", "1")
    assert store.check(["c"])
    assert not store.check(["c", "d"])
    assert store.check([])


def test_compare_set_semantics(server_proc: ServerProcess, torch_client: Callable[..., Any]) -> None:
    store = torch_client(server_proc.host, server_proc.port)
    # Missing key, empty expected: created.
    assert store.compare_set("cas", "", "first") == b"first"
    assert store.get("cas") == b"first"
    # Matching expected: swapped, new value returned.
    assert store.compare_set("cas", "first", "second") == b"second"
    # Wrong expected: unchanged, current value returned.
    assert store.compare_set("cas", "wrong", "third") == b"second"
    assert store.get("cas") == b"second"
    # Missing key with non-empty expected: torch answers `expected`, stores nothing.
    assert store.compare_set("cas-missing", "exp", "new") == b"exp"
    assert not store.check(["cas-missing"])


def test_add(server_proc: ServerProcess, torch_client: Callable[..., Any]) -> None:
    store = torch_client(server_proc.host, server_proc.port)
    assert store.add("counter", 1) == 1
    assert store.add("counter", 41) == 42
    assert store.add("counter", -50) == -8
    assert store.get("counter") == b"-8"
    assert store.add("zero", 0) == 0
    store.set("numeric", "10")
    assert store.add("numeric", 5) == 15
    assert store.add("big", 2**62) == 2**62
    assert store.add("big", 2**62 - 1) == 2**63 - 1  # int64 max
    assert store.add("big", -(2**63) + 1) == 0


def test_add_is_atomic_across_clients(server_proc: ServerProcess, torch_client: Callable[..., Any]) -> None:
    clients = [torch_client(server_proc.host, server_proc.port) for _ in range(4)]

    def bump(store: Any) -> None:
        for _ in range(50):
            store.add("atomic", 1)

    threads = [threading.Thread(target=bump, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert int(clients[0].get("atomic")) == 200


def test_multi_get_multi_set(server_proc: ServerProcess, torch_client: Callable[..., Any], dist: Any) -> None:
    store = torch_client(server_proc.host, server_proc.port, timeout=0.3)
    store.multi_set(["m1", "m2", "m3"], ["v1", "v2", b"v3"])
    assert store.multi_get(["m3", "m1", "m2"]) == [b"v3", b"v1", b"v2"]
    assert store.multi_get([]) == []
    with pytest.raises(dist.DistStoreError):
        store.multi_get(["m1", "not-there"])  # waits for all keys, then times out


def test_delete_and_num_keys(server_proc: ServerProcess, torch_client: Callable[..., Any]) -> None:
    store = torch_client(server_proc.host, server_proc.port)
    base = store.num_keys()
    store.set("d1", "x")
    store.set("d2", "y")
    assert store.num_keys() == base + 2
    assert store.delete_key("d1") is True
    assert store.delete_key("d1") is False
    assert store.num_keys() == base + 1
    assert not store.check(["d1"])


def test_num_keys_counts_the_init_key(server_proc: ServerProcess, torch_client: Callable[..., Any]) -> None:
    # With world_size, torch's client registers itself by adding to "init/" (outside the "/"
    # namespace); num_keys reports every key, as torch's server does.
    store = torch_client(server_proc.host, server_proc.port, world_size=1)
    assert store.num_keys() == 1
    store.set("x", "1")
    assert store.num_keys() == 2


def test_append(server_proc: ServerProcess, torch_client: Callable[..., Any]) -> None:
    store = torch_client(server_proc.host, server_proc.port)
    store.append("log", "a")
    store.append("log", "bc")
    store.append("log", b"\x00")
    assert store.get("log") == b"abc\x00"


def test_list_keys(server_proc: ServerProcess, torch_client: Callable[..., Any]) -> None:
    store = torch_client(server_proc.host, server_proc.port, world_size=1)
    store.set("one", "1")
    store.set("two", "2")
    assert sorted(store.list_keys()) == ["one", "two"]  # "init/" is outside the namespace


def test_queues(server_proc: ServerProcess, torch_client: Callable[..., Any], dist: Any) -> None:
    store = torch_client(server_proc.host, server_proc.port, timeout=0.5)
    assert store.queue_len("q") == 0
    store.queue_push("q", "first")
    store.queue_push("q", b"second")
    assert store.queue_len("q") == 2
    assert store.queue_pop("q") == b"first"
    assert store.queue_pop("q", block=False) == b"second"
    with pytest.raises(dist.QueueEmptyError):
        store.queue_pop("q", block=False)
    with pytest.raises(dist.DistStoreError):
        store.queue_pop("q")  # blocks, then times out

    # A blocked pop is released by a push from another client.
    other = torch_client(server_proc.host, server_proc.port)
    timer = threading.Timer(0.1, other.queue_push, args=("q2", "item"))
    timer.start()
    popper = torch_client(server_proc.host, server_proc.port, timeout=10)
    assert popper.queue_pop("q2") == b"item"
    timer.join()


def test_barrier(server_proc: ServerProcess, torch_client: Callable[..., Any], dist: Any) -> None:
    store = torch_client(server_proc.host, server_proc.port)
    store.barrier("solo", 1)
    with pytest.raises(dist.DistStoreError, match="barrier"):
        store.barrier("pair", 2, datetime.timedelta(seconds=0.3))
    # The barrier counted that arrival; another one completes it.
    store.barrier("pair", 2)

    clients = [torch_client(server_proc.host, server_proc.port) for _ in range(3)]
    done: list[int] = []

    def arrive(i: int) -> None:
        clients[i].barrier("three", 3, datetime.timedelta(seconds=10))
        done.append(i)

    threads = [threading.Thread(target=arrive, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert sorted(done) == [0, 1, 2]


def test_prefix_store(server_proc: ServerProcess, torch_client: Callable[..., Any], dist: Any) -> None:
    base = torch_client(server_proc.host, server_proc.port)
    prefixed = dist.PrefixStore("job/attempt_0", base)
    prefixed.set("rank0", "addr")
    assert prefixed.get("rank0") == b"addr"
    assert base.get("job/attempt_0/rank0") == b"addr"
    assert prefixed.add("count", 2) == 2
    assert prefixed.compare_set("cas", "", "v") == b"v"
    prefixed.wait(["rank0"])
    assert prefixed.check(["rank0"])
    assert prefixed.multi_get(["rank0", "cas"]) == [b"addr", b"v"]
    assert prefixed.delete_key("rank0")
    nested = dist.PrefixStore("inner", prefixed)
    nested.set("k", "v")
    assert base.get("job/attempt_0/inner/k") == b"v"


def test_torch_client_and_local_store_share_keys(
    server: StoreServer, torch_client: Callable[..., Any], dist: Any
) -> None:
    # The agent writes through server.store; a worker reads through torch, and back.
    store = torch_client(server.host, server.port)
    server.store.set("from-agent", b"hello")
    assert store.get("from-agent") == b"hello"
    store.set("from-worker", "hi")
    assert server.store.get("from-worker", timeout=1) == b"hi"

    # A local write releases a torch client blocked in wait (GIL released while waiting).
    timer = threading.Timer(0.2, server.store.set, args=("released", b"1"))
    timer.start()
    store.wait(["released"], datetime.timedelta(seconds=10))
    timer.join()
    assert server.store.add("released-count", 3) == 3
    assert store.add("released-count", 1) == 4


def test_torch_client_over_ipv6(torch_client: Callable[..., Any]) -> None:
    if not has_ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    proc = ServerProcess("::1")
    try:
        store = torch_client("::1", proc.port)
        store.set("v6", "yes")
        assert store.get("v6") == b"yes"
        assert store.add("n", 2) == 2
    finally:
        proc.close()
