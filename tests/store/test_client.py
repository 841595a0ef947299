"""Our pure-Python client against our server and against torch's own TCPStore servers."""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from launcher.store.api import KeyValueStore, StoreError, StoreTimeoutError
from launcher.store.client import QueueEmptyError, TCPStoreClient
from launcher.store.server import StoreServer

pytestmark = pytest.mark.timeout(60)


class Endpoint:
    def __init__(self, kind: str, host: str, port: int, holder: Any) -> None:
        self.kind = kind
        self.host = host
        self.port = port
        self.holder = holder  # keeps the server alive

    def client(self, **kwargs: Any) -> TCPStoreClient:
        kwargs.setdefault("timeout", 5.0)
        return TCPStoreClient(self.host, self.port, **kwargs)


@pytest.fixture(params=["ours", "torch-libuv", "torch-legacy"])
def endpoint(request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    """A server of each kind: ours, and torch's libuv and legacy servers (``is_master=True``)."""
    if request.param == "ours":
        with StoreServer() as server:
            yield Endpoint("ours", server.host, server.port, server)
        return
    dist = pytest.importorskip("torch.distributed")
    master = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        use_libuv=request.param == "torch-libuv",
        timeout=datetime.timedelta(seconds=10),
    )
    yield Endpoint(request.param, "127.0.0.1", master.port, master)


def test_implements_the_protocol(endpoint: Endpoint) -> None:
    with endpoint.client() as client:
        assert isinstance(client, KeyValueStore)


def test_basic_operations(endpoint: Endpoint) -> None:
    with endpoint.client() as client:
        client.set("a", b"1")
        assert client.get("a") == b"1"
        client.set("s", "text")  # str values are UTF-8 encoded
        assert client.get("s") == b"text"
        assert client.add("n", 5) == 5
        assert client.add("n", -7) == -2
        assert client.check(["a", "n"])
        assert not client.check(["a", "missing"])
        client.multi_set(["x", "y"], [b"X", b"Y"])
        assert client.multi_get(["y", "x"]) == [b"Y", b"X"]
        client.append("x", b"+")
        client.append("new", b"first")
        assert client.get("x") == b"X+"
        assert client.get("new") == b"first"
        keys = client.num_keys()
        assert client.delete("x") is True
        assert client.delete("x") is False
        assert client.num_keys() == keys - 1
        assert sorted(client.list_keys()) == ["a", "n", "new", "s", "y"]
        client.ping()
        big = b"\xab" * (3 << 20)
        client.set("big", big)
        assert client.get("big") == big


def test_compare_set(endpoint: Endpoint) -> None:
    with endpoint.client() as client:
        assert client.compare_set("c", b"", b"v1") == b"v1"
        assert client.compare_set("c", b"v1", b"v2") == b"v2"
        assert client.compare_set("c", b"nope", b"v3") == b"v2"
        assert client.get("c") == b"v2"
        assert client.compare_set("missing", b"exp", b"new") == b"exp"
        assert not client.check(["missing"])


def test_wait_timeout_keeps_connection_usable(endpoint: Endpoint) -> None:
    with endpoint.client() as client:
        start = time.monotonic()
        with pytest.raises(StoreTimeoutError, match="missing"):
            client.wait(["missing"], timeout=0.2)
        assert 0.15 <= time.monotonic() - start < 3
        with pytest.raises(StoreTimeoutError):
            client.get("missing", timeout=0.1)
        with pytest.raises(StoreTimeoutError):
            client.multi_get(["missing"], timeout=0.1)
        client.set("still", b"works")
        assert client.get("still") == b"works"


def test_default_timeout_applies(endpoint: Endpoint) -> None:
    with endpoint.client(timeout=0.2) as client:
        with pytest.raises(StoreTimeoutError):
            client.get("missing")
        assert client.add("k", 1) == 1


def test_wait_released_by_other_client(endpoint: Endpoint) -> None:
    with endpoint.client() as waiter, endpoint.client() as setter:
        timer = threading.Timer(0.1, setter.multi_set, args=(["w1", "w2"], [b"1", b"2"]))
        timer.start()
        waiter.wait(["w1", "w2"], timeout=10)
        assert waiter.multi_get(["w1", "w2"]) == [b"1", b"2"]
        timer.join()


def test_barrier(endpoint: Endpoint) -> None:
    clients = [endpoint.client() for _ in range(3)]
    try:
        errors: list[BaseException] = []

        def arrive(client: TCPStoreClient) -> None:
            try:
                client.barrier("b", 3, timeout=10)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=arrive, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        assert not errors
        with pytest.raises(StoreTimeoutError, match="barrier"):
            clients[0].barrier("lonely", 2, timeout=0.2)
        clients[0].set("after-barrier", b"ok")
        assert clients[0].get("after-barrier") == b"ok"
    finally:
        for c in clients:
            c.close()


def test_queues(endpoint: Endpoint) -> None:
    if endpoint.kind == "torch-legacy":
        pytest.skip("torch's legacy server has no queues")
    with endpoint.client() as client, endpoint.client() as other:
        assert client.queue_len("q") == 0
        client.queue_push("q", b"1")
        client.queue_push("q", b"2")
        assert client.queue_len("q") == 2
        assert client.queue_pop("q") == b"1"
        assert client.queue_pop("q", block=False) == b"2"
        with pytest.raises(QueueEmptyError):
            client.queue_pop("q", block=False)
        with pytest.raises(StoreTimeoutError):
            client.queue_pop("q", timeout=0.1)
        timer = threading.Timer(0.1, other.queue_push, args=("q", b"late"))
        timer.start()
        assert client.queue_pop("q", timeout=10) == b"late"
        timer.join()


def test_keys_match_torch_clients(endpoint: Endpoint) -> None:
    dist = pytest.importorskip("torch.distributed")
    if endpoint.kind == "ours":
        pytest.skip("covered by test_torch_client.py (GIL-holding torch calls need another process)")
    torch_store = dist.TCPStore(
        endpoint.host, endpoint.port, is_master=False, timeout=datetime.timedelta(seconds=5)
    )
    with endpoint.client() as client:
        client.set("ours", b"1")
        assert torch_store.get("ours") == b"1"
        torch_store.set("theirs", "2")
        assert client.get("theirs") == b"2"
        assert client.add("count", 1) == 1
        assert torch_store.add("count", 1) == 2


def test_unreachable_server_names_address_and_timeout() -> None:
    with StoreServer() as server:
        port = server.port  # free after close: nobody listens there
    start = time.monotonic()
    with pytest.raises(StoreError, match=rf"127\.0\.0\.1:{port} within 0\.3 s") as info:
        TCPStoreClient("127.0.0.1", port, connect_timeout=0.3)
    assert not isinstance(info.value, StoreTimeoutError)
    assert 0.25 <= time.monotonic() - start < 3


def test_connect_retries_until_server_appears() -> None:
    # Reserve a port, start the server on it a little later: the client keeps retrying.
    with StoreServer() as probe:
        port = probe.port
    late = StoreServer("127.0.0.1", port)
    timer = threading.Timer(0.3, late.start)
    timer.start()
    try:
        with TCPStoreClient("127.0.0.1", port, timeout=10) as client:
            client.set("k", b"v")
            assert late.store.get("k") == b"v"
    finally:
        timer.join()
        late.close()


def test_non_store_peer_is_rejected() -> None:
    # A listener that accepts and closes at once (not a TCPStore): connect fails with StoreError.
    with StoreServer() as probe:
        port = probe.port
    script = (
        "import socket, sys\n"
        f"s = socket.create_server(('127.0.0.1', {port}))\n"
        "print('ready', flush=True)\n"
        "s.settimeout(10)\n"
        "while True:\n"
        "    try: c, _ = s.accept()\n"
        "    except OSError: break\n"
        "    c.close()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match="within 0.5 s"):
            TCPStoreClient("127.0.0.1", port, connect_timeout=0.5)
    finally:
        proc.kill()
        proc.wait()


def test_closed_client_raises() -> None:
    with StoreServer() as server:
        client = TCPStoreClient(server.host, server.port)
        client.close()
        client.close()  # idempotent
        with pytest.raises(StoreError, match="closed"):
            client.set("k", b"v")


def test_close_from_another_thread_interrupts_wait() -> None:
    with StoreServer() as server:
        client = TCPStoreClient(server.host, server.port, timeout=30)
        timer = threading.Timer(0.2, client.close)
        timer.start()
        start = time.monotonic()
        with pytest.raises(StoreError) as info:
            client.wait(["never"])
        assert not isinstance(info.value, StoreTimeoutError)
        assert time.monotonic() - start < 5
        timer.join()


def test_reconnects_after_the_server_restarts() -> None:
    first = StoreServer().start()
    port = first.port
    client = TCPStoreClient("127.0.0.1", port, timeout=5)
    try:
        client.set("k", b"v")
        first.close()
        with pytest.raises(StoreError):
            client.get("k")  # the connection is gone
        with StoreServer("127.0.0.1", port) as second:
            client.set("k", b"again")  # the next call reconnects
            assert second.store.get("k") == b"again"
    finally:
        client.close()
        first.close()


class _Interrupted(Exception):
    pass


def test_a_call_ended_by_a_signal_handler_leaves_the_connection_usable(server: StoreServer) -> None:
    """The agent's signal handler raises out of a blocked rendezvous call (launcher.agent.signals):
    the next call must neither read the abandoned call's reply nor wait for it."""
    import signal

    def interrupt(_signum: int, _frame: Any) -> None:
        raise _Interrupted

    client = TCPStoreClient(server.host, server.port, timeout=30)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Interrupted):
            client.wait(["never"])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    start = time.monotonic()
    client.set("never", b"1")  # releases the abandoned wait: its late reply must not be read as an answer
    assert client.compare_set("k", b"", b"v") == b"v"
    assert client.get("k") == b"v" and client.check(["never"])
    assert time.monotonic() - start < 10  # not the 30 s the abandoned wait had left
    client.close()
