"""Our server itself: lifecycle, addresses, scale, hostile clients, the in-process store."""

from __future__ import annotations

import datetime
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from launcher.store.api import KeyValueStore, StoreError, StoreTimeoutError
from launcher.store.client import TCPStoreClient
from launcher.store.server import VALIDATION_MAGIC, QueryType, StoreServer

from .conftest import has_ipv6_loopback

pytestmark = pytest.mark.timeout(60)

VALIDATE = struct.pack("<BI", QueryType.VALIDATE, VALIDATION_MAGIC)


def blob(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def raw_connect(server: StoreServer, validate: bool = True) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=5)
    if validate:
        sock.sendall(VALIDATE)
    return sock


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def is_closed_by_peer(sock: socket.socket, within: float = 5.0) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


# ---------------------------------------------------------------------- lifecycle and addresses


def test_port_zero_gives_distinct_ports() -> None:
    servers = [StoreServer().start() for _ in range(20)]
    try:
        ports = {s.port for s in servers}
        assert len(ports) == 20 and 0 not in ports
        for s in servers:
            assert s.host == "127.0.0.1"
            assert s.address == f"127.0.0.1:{s.port}"
    finally:
        for s in servers:
            s.close()


def test_context_manager_and_idempotent_close() -> None:
    with StoreServer() as server:
        assert server.running
        port = server.port
        with TCPStoreClient(server.host, port, timeout=5) as client:
            client.set("k", b"v")
    assert not server.running
    server.close()  # again: no error
    with pytest.raises(StoreError):
        server.start()
    with pytest.raises(StoreError):
        server.store.set("k", b"v")


def test_close_never_started() -> None:
    server = StoreServer()
    server.close()
    server.close()


def test_start_twice_fails(server: StoreServer) -> None:
    with pytest.raises(StoreError, match="already"):
        server.start()


def test_address_in_use_is_a_store_error(server: StoreServer) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
            StoreServer("127.0.0.1", port).start()


def test_serves_on_a_given_bound_socket() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    with StoreServer(sock=sock) as server:
        assert server.port == port
        with TCPStoreClient("127.0.0.1", port, timeout=5) as client:
            assert client.add("x", 2) == 2
    assert sock.fileno() == -1  # the server took ownership and closed it


def test_ipv6_loopback() -> None:
    if not has_ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    with StoreServer("::1", 0) as server:
        assert server.host == "::1"
        assert server.address == f"[::1]:{server.port}"
        with TCPStoreClient("::1", server.port, timeout=5) as client:
            client.set("v6", b"yes")
            assert client.get("v6") == b"yes"
        with TCPStoreClient("[::1]", server.port, timeout=5) as client:
            assert client.get("v6") == b"yes"
    with StoreServer("[::1]", 0) as server:
        assert server.host == "::1"


def test_wildcard_is_dual_stack() -> None:
    if not has_ipv6_loopback():
        pytest.skip("no IPv6 on this machine")
    with StoreServer("::", 0) as server:
        with TCPStoreClient("::1", server.port, timeout=5) as v6:
            v6.set("k", b"v")
        with TCPStoreClient("127.0.0.1", server.port, timeout=5) as v4:
            assert v4.get("k") == b"v"


def test_import_does_not_pull_in_torch() -> None:
    code = "import sys, launcher.store.server, launcher.store.client; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------- scale


def test_hundreds_of_concurrent_clients(server: StoreServer) -> None:
    n = 300
    clients = [TCPStoreClient(server.host, server.port, timeout=30) for _ in range(n)]
    try:
        results: list[int] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def member(client: TCPStoreClient) -> None:
            try:
                rank = client.add("joined", 1)
                client.wait(["go"], timeout=30)
                value = client.get("go")
                assert value == b"now"
                with lock:
                    results.append(rank)
            except BaseException as exc:  # pragma: no cover - reported below
                with lock:
                    errors.append(exc)

        threads = [threading.Thread(target=member, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        # Everybody joined and is (or will be) blocked in wait; then release them all at once.
        server.store.wait(["joined"], timeout=30)
        deadline = time.monotonic() + 30
        while int(server.store.get("joined")) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        server.store.set("go", b"now")
        for t in threads:
            t.join(30)
        assert not errors
        assert sorted(results) == list(range(1, n + 1))
    finally:
        for c in clients:
            c.close()


def test_a_read_asks_for_less_than_the_allocators_mmap_threshold() -> None:
    # Python allocates the whole size asked of recv() before the kernel fills it; past glibc's
    # mmap threshold (128 KiB) that costs an mmap, an mremap and a munmap per request, most of
    # the host's CPU in a round of thousands of nodes (docs/rendezvous.md, "Scale").
    from launcher.store import loop

    assert loop._RECV_SIZE <= 64 << 10


def test_a_thousand_raw_waiting_connections(server: StoreServer) -> None:
    # No threads: 1,000 sockets each validate, ping and block in WAIT; one write releases all.
    socks = []
    try:
        wait_msg = struct.pack("<BQ", QueryType.WAIT, 1) + blob(b"/release")
        for i in range(1000):
            sock = raw_connect(server)
            sock.sendall(struct.pack("<BI", QueryType.PING, i) + wait_msg)
            socks.append(sock)
        for i, sock in enumerate(socks):
            assert struct.unpack("<I", recv_exact(sock, 4))[0] == i
        server.store.set("release", b"1")
        for sock in socks:
            assert recv_exact(sock, 1) == b"\x00"  # STOP_WAITING
    finally:
        for sock in socks:
            sock.close()


# ---------------------------------------------------------------------- hostile clients


def _assert_server_healthy(server: StoreServer) -> None:
    with TCPStoreClient(server.host, server.port, timeout=5) as client:
        client.set("health", b"ok")
        assert client.get("health") == b"ok"


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(struct.pack("<BI", QueryType.VALIDATE, 0xDEADBEEF), id="wrong-magic"),
        pytest.param(struct.pack("<BI", QueryType.PING, 1), id="no-validation"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
        pytest.param(VALIDATE + bytes([200]), id="unknown-query"),
        pytest.param(VALIDATE + struct.pack("<BQ", QueryType.SET, 1 << 62), id="huge-key-length"),
        pytest.param(VALIDATE + struct.pack("<BQ", QueryType.WAIT, 1 << 40), id="huge-key-count"),
        pytest.param(
            VALIDATE + bytes([QueryType.SET]) + blob(b"/k") + struct.pack("<Q", 1 << 62), id="huge-value"
        ),
        pytest.param(
            VALIDATE
            + bytes([QueryType.SET])
            + blob(b"/n")
            + blob(b"abc")
            + bytes([QueryType.ADD])
            + blob(b"/n")
            + struct.pack("<q", 1),
            id="add-to-non-integer",
        ),
    ],
)
def test_malformed_client_is_dropped_server_survives(server: StoreServer, payload: bytes) -> None:
    bystander = TCPStoreClient(server.host, server.port, timeout=5)
    bystander.set("before", b"1")
    sock = raw_connect(server, validate=False)
    sock.sendall(payload)
    assert is_closed_by_peer(sock)
    sock.close()
    _assert_server_healthy(server)
    assert bystander.get("before") == b"1"  # other connections are untouched
    bystander.close()


def test_half_message_then_disconnect(server: StoreServer) -> None:
    sock = raw_connect(server)
    sock.sendall(bytes([QueryType.SET]) + struct.pack("<Q", 100) + b"/partial")
    sock.close()
    _assert_server_healthy(server)
    assert not server.store.check(["partial"])


def test_abrupt_reset_while_waiting(server: StoreServer) -> None:
    sock = raw_connect(server)
    sock.sendall(struct.pack("<BQ", QueryType.WAIT, 1) + blob(b"/never"))
    time.sleep(0.05)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
    sock.close()
    time.sleep(0.05)
    server.store.set("never", b"now")  # releasing a vanished waiter must be harmless
    _assert_server_healthy(server)


def test_messages_split_byte_by_byte(server: StoreServer) -> None:
    sock = raw_connect(server, validate=False)
    msg = VALIDATE + bytes([QueryType.SET]) + blob(b"/slow") + blob(b"value")
    msg += bytes([QueryType.GET]) + blob(b"/slow")
    for b in msg:
        sock.sendall(bytes([b]))
    assert recv_exact(sock, 8 + 5) == blob(b"value")
    sock.close()


def test_pipelined_requests_in_one_packet(server: StoreServer) -> None:
    sock = raw_connect(server, validate=False)
    msg = VALIDATE
    msg += bytes([QueryType.ADD]) + blob(b"/p") + struct.pack("<q", 2)
    msg += bytes([QueryType.ADD]) + blob(b"/p") + struct.pack("<q", 3)
    msg += bytes([QueryType.CHECK]) + struct.pack("<Q", 1) + blob(b"/p")
    msg += bytes([QueryType.CANCEL_WAIT])  # no wait pending: still acknowledged
    sock.sendall(msg)
    assert recv_exact(sock, 8 + 8 + 1 + 1) == struct.pack("<qq", 2, 5) + b"\x00\x01"
    sock.close()


# ---------------------------------------------------------------------- close() with waiters


def test_close_releases_waiting_clients(torch_client: Callable[..., Any], dist: Any) -> None:
    server = StoreServer().start()
    ours = TCPStoreClient(server.host, server.port, timeout=30)
    theirs = torch_client(server.host, server.port, timeout=30)
    outcomes: dict[str, BaseException | None] = {}

    def wait_ours() -> None:
        try:
            ours.wait(["never"])
            outcomes["ours"] = None
        except BaseException as exc:
            outcomes["ours"] = exc

    def wait_theirs() -> None:
        try:
            theirs.wait(["never"], datetime.timedelta(seconds=30))
            outcomes["theirs"] = None
        except BaseException as exc:
            outcomes["theirs"] = exc

    def wait_local() -> None:
        try:
            server.store.wait(["never"], timeout=30)
            outcomes["local"] = None
        except BaseException as exc:
            outcomes["local"] = exc

    threads = [threading.Thread(target=f) for f in (wait_ours, wait_theirs, wait_local)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    start = time.monotonic()
    server.close()
    for t in threads:
        t.join(10)
    assert time.monotonic() - start < 5
    assert isinstance(outcomes["ours"], StoreError)
    assert not isinstance(outcomes["ours"], StoreTimeoutError)
    assert isinstance(outcomes["theirs"], dist.DistError)
    assert isinstance(outcomes["local"], StoreError)
    ours.close()


# ---------------------------------------------------------------------- in-process store


def test_local_store_operations(server: StoreServer) -> None:
    store = server.store
    assert isinstance(store, KeyValueStore)
    store.set("a", b"1")
    assert store.get("a") == b"1"
    assert store.add("n", 2) == 2
    assert store.add("n", -5) == -3
    assert store.compare_set("c", b"", b"x") == b"x"
    assert store.compare_set("c", b"x", b"y") == b"y"
    assert store.compare_set("c", b"nope", b"z") == b"y"
    assert store.compare_set("gone", b"e", b"d") == b"e"
    store.multi_set(["m1", "m2"], [b"1", b"2"])
    assert store.multi_get(["m2", "m1"]) == [b"2", b"1"]
    assert store.check(["a", "m1"]) and not store.check(["a", "zz"])
    store.append("ap", b"x")
    store.append("ap", b"y")
    assert store.get("ap") == b"xy"
    assert store.num_keys() == 6
    assert store.delete("ap") and not store.delete("ap")
    with pytest.raises(StoreTimeoutError):
        store.get("missing", timeout=0.05)
    with pytest.raises(StoreTimeoutError):
        store.wait(["missing"], timeout=0.05)
    store.set("text", b"abc")
    with pytest.raises(StoreError):
        store.add("text", 1)
    store.close()  # no-op
    # Local writes are in the clients' namespace.
    with TCPStoreClient(server.host, server.port, timeout=5) as client:
        assert client.get("a") == b"1"
        assert sorted(client.list_keys()) == ["a", "c", "m1", "m2", "n", "text"]


def test_local_write_releases_remote_waiter_and_vice_versa(server: StoreServer) -> None:
    with TCPStoreClient(server.host, server.port, timeout=10) as client:
        timer = threading.Timer(0.1, server.store.set, args=("from-local", b"1"))
        timer.start()
        client.wait(["from-local"], timeout=10)
        timer.join()
        timer = threading.Timer(0.1, client.set, args=("from-remote", b"2"))
        timer.start()
        assert server.store.get("from-remote", timeout=10) == b"2"
        timer.join()


def test_local_exit_barrier_pattern(server: StoreServer) -> None:
    # How the agent uses it: each participant adds to a counter, then waits for a done key that
    # the last arrival sets.
    n = 5

    def participant(store: KeyValueStore) -> None:
        if store.add("exit/count", 1) == n:
            store.set("exit/done", b"1")
        store.wait(["exit/done"], timeout=10)

    clients = [TCPStoreClient(server.host, server.port, timeout=10) for _ in range(n - 1)]
    stores: list[KeyValueStore] = [server.store, *clients]
    threads = [threading.Thread(target=participant, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert not any(t.is_alive() for t in threads)
    assert server.store.get("exit/count") == str(n).encode()
    for c in clients:
        c.close()
