"""The waiting-spare request (``SPARE_HELLO``): what a store restricted to a running round's
members tells a refused agent, and nothing more (see docs/store-security.md).

A real server in a namespace host, raw sockets and launcher's client in other hosts: loopback
and the server's own addresses are always admitted, so a refused peer needs a host of its own.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from launcher.store.admission import SPARE_ADMITTED, SPARE_ENDED, SPARE_HELLO, SPARE_PROVE, SPARE_RUNNING
from launcher.store.protocol import U8, U32, VALIDATION_MAGIC, QueryType

from tests.multinode.netns import Network, cleanup_stale, unavailable_reason
from tests.store.test_admission import SECRET, NamespaceStore

pytestmark = pytest.mark.timeout(120)

# Sends the bytes given in hex, then reads until the server closes the connection (or 5 s
# pass: "open"); prints what came back, in hex.
RAW = """
import socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
sock.sendall(bytes.fromhex(sys.argv[3]))
sock.settimeout(5)
got = b""
try:
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    end = "closed"
except TimeoutError:
    end = "open"
except ConnectionError:
    end = "reset"
print(got.hex() or "-", end, flush=True)
"""

# launcher's rendezvous client as a would-be spare: prints one line when it waits (the log
# line), and its outcome once it connected, or why it could not.
SPARE = """
import logging, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="log %(message)s")
from launcher.store.client import TCPStoreClient
from launcher.store.connection import JobEnded, SpareStoreGone
start = time.monotonic()
try:
    store = TCPStoreClient(sys.argv[1], int(sys.argv[2]), timeout=5, connect_timeout=30, refused_timeout=1,
                           spare=True, gone_timeout=2)
    store.set("spare", b"in")
    print("in", flush=True)
except JobEnded as exc:
    print("ended", round(time.monotonic() - start, 1), exc, flush=True)
except SpareStoreGone as exc:
    print("gone", exc, flush=True)
"""


def raw(host, store: NamespaceStore, payload: bytes, at: str | None = None) -> tuple[str, str]:
    """What the server sends back to ``payload`` from ``host``, and how the connection ended."""
    out = subprocess.run(
        host.argv([sys.executable, "-c", RAW, at or store.host.addr, str(store.port), payload.hex()]),
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()
    return out[0], out[1]


def hello() -> bytes:
    return U8.pack(SPARE_HELLO)


def set_request(key: str) -> bytes:
    """VALIDATE, then SET ``key`` (torch's wire format: a key and a value, each u64-length-prefixed)."""
    import struct

    raw_key = ("/" + key).encode()
    return (U8.pack(QueryType.VALIDATE) + U32.pack(VALIDATION_MAGIC) + U8.pack(QueryType.SET)
            + struct.pack("<Q", len(raw_key)) + raw_key + struct.pack("<Q", 1) + b"x")


@pytest.fixture
def hosts() -> Iterator[Network]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    cleanup_stale()
    network = Network(3)
    network.create()
    try:
        yield network
    finally:
        network.destroy()


def test_a_refused_spare_learns_only_whether_the_job_runs(hosts: Network) -> None:
    server_host, member, spare = hosts[0], hosts[1], hosts[2]
    store = NamespaceStore(server_host, "", None)
    try:
        assert store.ask(f"restrict {member.addr}") == "ok"
        # One byte back, "the job runs", and the connection closed: counted as waiting to join.
        assert raw(spare, store, hello()) == (f"{SPARE_RUNNING:02x}", "closed")
        assert store.ask("knocks") == spare.addr
        assert store.ask("spares") == spare.addr
        # Job keys stay closed to it: a SET sent behind the question is never run (the server
        # closes with it unread, so the kernel may reset the connection rather than close it).
        got, end = raw(spare, store, hello() + set_request("launcher/rdzv/job/closed"))
        assert got in (f"{SPARE_RUNNING:02x}", "-") and end != "open", (got, end)
        assert store.ask("has launcher/rdzv/job/closed") == "False"
        # Without the question, a refused peer gets nothing at all (as before).
        assert raw(spare, store, set_request("x"))[0] == "-"
        assert store.ask("has x") == "False"
        # The job's end: told so, and no longer one to wait for.
        assert store.ask("end") == "ok"
        assert raw(spare, store, hello()) == (f"{SPARE_ENDED:02x}", "closed")
        assert store.ask("spares") == "-"
    finally:
        log = store.close()
    assert f"store server refused {spare.addr}" in log and "which waits as a spare" in log, log


def test_an_admitted_peer_is_told_so_and_goes_on_with_its_handshake(hosts: Network) -> None:
    server_host, member = hosts[0], hosts[1]
    store = NamespaceStore(server_host, "", None)
    try:
        assert store.ask(f"restrict {member.addr}") == "ok"
        ping = U8.pack(QueryType.PING) + U32.pack(7)
        got, end = raw(member, store, hello() + U8.pack(QueryType.VALIDATE) + U32.pack(VALIDATION_MAGIC) + ping)
        assert (got, end) == (f"{SPARE_ADMITTED:02x}" + U32.pack(7).hex(), "open")
        assert store.ask("spares") == "-" and store.ask("knocks") == "-"
    finally:
        store.close()


def test_a_store_with_a_secret_answers_prove_it_and_keeps_its_keys(hosts: Network) -> None:
    """With a secret, a peer without it is neither a spare nor counted: it must prove it."""
    server_host, joiner = hosts[0], hosts[1]
    store = NamespaceStore(server_host, "", SECRET)
    try:
        assert raw(joiner, store, hello()) == (f"{SPARE_PROVE:02x}", "open")  # and it may still prove it
        got, end = raw(joiner, store, hello() + set_request("k"))
        assert got in (f"{SPARE_PROVE:02x}", "-") and end != "open", (got, end)  # a SET unproven: closed
        assert store.ask("has k") == "False"
        assert store.ask("knocks") == "-"
    finally:
        store.close()


def spare_client(host, store: NamespaceStore) -> subprocess.Popen[str]:
    return subprocess.Popen(host.argv([sys.executable, "-c", SPARE, store.host.addr, str(store.port)]),
                            stdout=subprocess.PIPE, text=True)


def wait_line(proc: subprocess.Popen[str], text: str) -> list[str]:
    """Lines of ``proc`` up to the first that contains ``text`` (fails if it ends first)."""
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"{text!r} never came: {''.join(lines)}")


def test_the_client_waits_as_a_spare_then_gets_in_when_a_round_opens(hosts: Network) -> None:
    """Refused long past its refused_timeout (1 s), it waits as a spare, then joins."""
    server_host, member, spare = hosts[0], hosts[1], hosts[2]
    store = NamespaceStore(server_host, "", None)
    try:
        assert store.ask(f"restrict {member.addr}") == "ok"
        proc = spare_client(spare, store)
        wait_line(proc, "this node waits as a spare")
        deadline = time.monotonic() + 2.5  # past refused_timeout: a plain client would have given up
        while time.monotonic() < deadline:
            assert store.ask("spares") == spare.addr  # it keeps asking (every second or so)
            time.sleep(0.5)
        assert store.ask("has spare") == "False"
        assert store.ask("open") == "ok"
        out, _ = proc.communicate(timeout=30)
        assert out.strip().endswith("in"), out
        assert store.ask("has spare") == "True"
    finally:
        store.close()


def test_the_client_learns_the_job_ended(hosts: Network) -> None:
    server_host, member, spare = hosts[0], hosts[1], hosts[2]
    store = NamespaceStore(server_host, "", None)
    try:
        assert store.ask(f"restrict {member.addr}") == "ok"
        proc = spare_client(spare, store)
        wait_line(proc, "this node waits as a spare")
        assert store.ask("end") == "ok"
        out, _ = proc.communicate(timeout=30)
        assert out.startswith("ended") and "says the job has ended" in out, out
        assert store.ask("spares") == "-"
    finally:
        store.close()


def test_a_store_gone_without_a_word_is_not_an_ending(hosts: Network) -> None:
    """The store's host dies while the spare waits: it says so after gone_timeout, and does
    not take it for the job's end."""
    server_host, member, spare = hosts[0], hosts[1], hosts[2]
    store = NamespaceStore(server_host, "", None)
    try:
        assert store.ask(f"restrict {member.addr}") == "ok"
        proc = spare_client(spare, store)
        wait_line(proc, "this node waits as a spare")
    finally:
        store.close()
    out, _ = proc.communicate(timeout=30)
    assert out.startswith("gone") and "without saying the job ended" in out, out
