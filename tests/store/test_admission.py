"""Who may use the store: the policy itself, the secret handshake over loopback, and namespace
hosts (a member, a foreigner, a joiner with and without the secret) against a real server."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from launcher.store.admission import Admission, Verdict, resolve_addresses
from launcher.store.api import StoreError
from launcher.store.client import TCPStoreClient
from launcher.store.server import StoreServer

from tests.multinode.netns import Host, Network, cleanup_stale, unavailable_reason

pytestmark = pytest.mark.timeout(180)

SECRET = b"0123456789abcdef-site-secret"
#: How long a client expected to be refused keeps trying (a refusal closes each connection at once,
#: so this is several tries); an admitted client gets 10 s to connect and write.
REFUSED_AFTER = 1.0
ip = ipaddress.ip_address


# ---------------------------------------------------------------------- the policy


def test_the_address_types_are_there_at_run_time() -> None:
    # Annotations only inside launcher (ipaddress loads lazily), but public names all the same.
    from launcher.store import admission

    assert isinstance(ip("10.0.0.1"), admission.IPAddress)
    assert isinstance(ip("fd00::1"), admission.IPAddress)
    assert isinstance(ipaddress.ip_network("fd00::/8"), admission.IPNetwork)
    assert not isinstance("10.0.0.1", admission.IPAddress)
    with pytest.raises(AttributeError, match="no attribute 'IPAdress'"):
        admission.IPAdress  # noqa: B018


def test_policy_verdicts() -> None:
    open_policy = Admission()
    assert open_policy.verdict(ip("10.1.2.3"), None) is Verdict.ADMIT
    ranged = Admission(join_networks=["10.0.0.0/8", "fd00::/8"], secret=SECRET)
    assert ranged.verdict(ip("10.1.2.3"), None) is Verdict.AUTHENTICATE
    assert ranged.verdict(ip("fd00::5"), None) is Verdict.AUTHENTICATE
    assert ranged.verdict(ip("192.168.0.1"), None) is Verdict.REFUSE
    assert ranged.verdict(ip("127.0.0.1"), None) is Verdict.ADMIT  # loopback: local workers
    assert ranged.verdict(ip("::1"), None) is Verdict.ADMIT
    members = frozenset({ip("10.0.0.2")})
    assert ranged.verdict(ip("10.0.0.2"), members) is Verdict.ADMIT
    assert ranged.verdict(ip("10.0.0.3"), members) is Verdict.REFUSE
    assert ranged.verdict(ip("10.0.0.3"), members, authenticated_joiners=True) is Verdict.AUTHENTICATE
    assert ranged.verdict(ip("192.168.0.1"), members, authenticated_joiners=True) is Verdict.REFUSE
    assert Admission().verdict(ip("10.0.0.3"), members, authenticated_joiners=True) is Verdict.REFUSE


def test_policy_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="not an address range"):
        Admission(join_networks=["10.0.0.0/33"])
    with pytest.raises(ValueError, match="empty"):
        Admission(secret=b"")
    assert "secret" not in repr(Admission(secret=SECRET)).replace("secret=", "")  # never printed


def test_ipv4_mapped_members_match() -> None:
    assert resolve_addresses(["::ffff:10.0.0.2", "[fd00::1]", "localhost"]) >= {ip("10.0.0.2"), ip("fd00::1")}
    with pytest.raises(ValueError, match="cannot resolve"):
        resolve_addresses(["no-such-host.invalid"])


# ---------------------------------------------------------------------- the handshake, over loopback


def test_client_with_the_secret_authenticates(server: StoreServer) -> None:
    server.admission = Admission(secret=SECRET)
    with TCPStoreClient(server.host, server.port, timeout=10, secret=SECRET) as client:
        client.set("k", b"v")
        assert client.get("k") == b"v"


def test_wrong_secret_fails_at_once_without_retrying(server: StoreServer) -> None:
    server.admission = Admission(secret=SECRET)
    with pytest.raises(StoreError, match="secret"):
        TCPStoreClient(server.host, server.port, timeout=60, secret=b"another-secret-entirely")


def test_client_with_a_secret_refuses_a_server_without_one(server: StoreServer) -> None:
    with pytest.raises(StoreError, match="no secret configured"):
        TCPStoreClient(server.host, server.port, timeout=60, secret=SECRET)


# ---------------------------------------------------------------------- namespace hosts

# The store, served from a namespace host; commands on stdin, one answer line each.
SERVE = """
import logging, sys
logging.basicConfig(level=logging.INFO)
from launcher.store.admission import Admission
from launcher.store.server import StoreServer
networks = [n for n in sys.argv[1].split(";") if n]
secret = sys.argv[2].encode() if sys.argv[2] != "-" else None
server = StoreServer("0.0.0.0", 0)
server.admission = Admission(join_networks=networks, secret=secret)
server.log_interval = 3600
server.start()
print(server.port, flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "restrict":
        server.restrict_to(arg.split(","))
        print("ok", flush=True)
    elif cmd == "restrict-joiners":  # as the c10d backend with a secret: joiners that prove it may wait
        server.restrict_to(arg.split(","), authenticated_joiners=True)
        print("ok", flush=True)
    elif cmd == "open":
        server.restrict_to(None)
        print("ok", flush=True)
    elif cmd == "knocks":
        print(",".join(sorted(map(str, server.knocking()))) or "-", flush=True)
    elif cmd == "has":
        print(server.store.check([arg]), flush=True)
    elif cmd == "end":  # the job's rendezvous is closed (launcher.rendezvous.dynamic: set_closed)
        server.end_job()
        print("ok", flush=True)
    elif cmd == "spares":
        print(",".join(sorted(map(str, server.untold_spares()))) or "-", flush=True)
server.close()
"""

# Clients of one host, one per line on stdin: ours (with or without a secret) or torch's; prints
# "ok" or "refused <why>" for each. Each line is a new client (new connections), but the process
# stays: torch is imported once per host rather than once per client.
CLIENTS = """
import sys
for line in sys.stdin:
    kind, host, port, key, secret, timeout = line.split()
    store = None
    try:
        if kind == "torch":
            import datetime
            import torch.distributed as dist
            wait = datetime.timedelta(seconds=float(timeout))
            store = dist.TCPStore(host, int(port), is_master=False, timeout=wait)
        elif kind == "reader":  # launcher status: reads only, and says so
            from launcher.store.client import TCPStoreClient
            store = TCPStoreClient(host, int(port), timeout=float(timeout), refused_timeout=0.0, reader=True,
                                   secret=secret.encode() if secret != "-" else None)
            store.check([key])
            print("ok", flush=True)
            continue
        else:
            from launcher.store.client import TCPStoreClient
            store = TCPStoreClient(host, int(port), timeout=float(timeout),
                                   secret=secret.encode() if secret != "-" else None)
        store.set(key, b"written")
        assert store.get(key) == b"written"
        print("ok", flush=True)
    except Exception as exc:
        print("refused", type(exc).__name__, str(exc).splitlines()[0][:200], flush=True)
    finally:
        # Its connection closes now, as a client process that exits closes it.
        if kind != "torch" and store is not None:
            store.close()
        del store
"""


# A client halfway through proving the secret: it has the server's challenge and proof, and sends
# its own proof (then validates, pings and writes) only when told to (on stdin).
MIDWAY = """
import os, socket, sys
from launcher.store.admission import AUTH_HELLO, AUTH_PROOF, NONCE_LEN, PROOF_LEN, client_proof, new_nonce
from launcher.store.connection import Deadline, recv_exact
from launcher.store.protocol import U8, U32, VALIDATION_MAGIC, QueryType
host, port, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
sock = socket.create_connection((host, port), timeout=10)
def exact(n):
    return recv_exact(sock, n, Deadline(10))
mine = new_nonce()
sock.sendall(U8.pack(AUTH_HELLO) + mine)
assert exact(1) == b"\\x00"
theirs = exact(NONCE_LEN)
exact(PROOF_LEN)
print("challenged", flush=True)
sys.stdin.readline()
try:
    sock.sendall(U8.pack(AUTH_PROOF) + client_proof(secret, theirs, mine))
    assert exact(1) == b"\\x00"
    sock.sendall(U8.pack(QueryType.VALIDATE) + U32.pack(VALIDATION_MAGIC) + U8.pack(QueryType.PING) + U32.pack(7))
    assert U32.unpack(exact(4))[0] == 7
    print("ok", flush=True)
except Exception as exc:
    print("refused", type(exc).__name__, exc, flush=True)
"""


# A client that connects first and writes only when told to (on stdin).
LATE_WRITER = """
import sys
from launcher.store.client import TCPStoreClient
store = TCPStoreClient(sys.argv[1], int(sys.argv[2]), timeout=3, connect_timeout=10, secret=sys.argv[3].encode())
store.ping()
print("connected", flush=True)
sys.stdin.readline()
try:
    store.set("late", b"x")
    store.ping()
    print("ok", flush=True)
except Exception as exc:
    print("refused", type(exc).__name__, flush=True)
"""


class NamespaceStore:
    """Our server running inside ``host``."""

    def __init__(self, host: Host, networks: str, secret: bytes | None) -> None:
        self.host = host
        self.proc = subprocess.Popen(
            host.argv([sys.executable, "-c", SERVE, networks, secret.decode() if secret else "-"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> str:
        """Stop the server; what it logged."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        return self.proc.stderr.read()


class HostClients:
    """One :data:`CLIENTS` process per namespace host, started at its first client."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def run(self, host: Host, line: str) -> str:
        proc = self.procs.get(host.netns)
        if proc is None:
            proc = self.procs[host.netns] = subprocess.Popen(
                host.argv([sys.executable, "-c", CLIENTS]), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        verdict = proc.stdout.readline().strip()
        assert verdict, f"the clients of {host.netns} exited with {proc.wait(timeout=30)}"
        return verdict

    def close(self) -> None:
        """End the client processes (each is idle between lines: nothing is lost)."""
        for proc in self.procs.values():
            proc.kill()
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs.clear()


_clients = HostClients()


def use(host: Host, store: NamespaceStore, kind: str, key: str, secret: bytes | None = None, at: str = "",
        timeout: float = 10.0) -> str:
    """One new client of ``kind`` on ``host`` against ``store``, giving up after ``timeout``
    seconds; its one-line verdict."""
    target = at or store.host.addr
    return _clients.run(host, f"{kind} {target} {store.port} {key} {secret.decode() if secret else '-'} {timeout}")


@pytest.fixture
def hosts() -> Iterator[Network]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("torch.distributed")
    cleanup_stale()
    network = Network(3)
    network.create()
    try:
        yield network
    finally:
        _clients.close()
        network.destroy()


def test_joiners_need_the_secret_and_members_keep_access_once_restricted(hosts: Network) -> None:
    server_host, member, foreigner = hosts[0], hosts[1], hosts[2]
    store = NamespaceStore(server_host, "10.213.0.0/24", SECRET)
    try:
        # The round is open: a joiner must prove the secret; torch's client cannot.
        assert use(member, store, "ours", "join-1", SECRET) == "ok"
        assert use(foreigner, store, "ours", "join-2", timeout=REFUSED_AFTER).startswith("refused")
        wrong = b"a-wrong-secret-of-length"
        assert use(foreigner, store, "ours", "join-3", wrong, timeout=REFUSED_AFTER).startswith("refused")
        assert use(foreigner, store, "ours", "join-4", SECRET) == "ok"
        assert use(member, store, "torch", "worker-0", timeout=REFUSED_AFTER).startswith("refused")
        assert store.ask("has join-2") == "False" and store.ask("has join-3") == "False"

        # A foreigner connected with the secret before the round closed...
        late = subprocess.Popen(
            foreigner.argv([sys.executable, "-c", LATE_WRITER, server_host.addr, str(store.port), SECRET.decode()]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert late.stdout is not None
        assert late.stdout.readline().strip() == "connected"

        # The round closes: only the member (and loopback) may use the store now.
        assert store.ask(f"restrict {member.addr}") == "ok"
        assert use(member, store, "torch", "worker-1") == "ok"  # workers: admitted by address
        assert use(member, store, "ours", "agent-1") == "ok"
        assert use(server_host, store, "torch", "local-1", at="127.0.0.1") == "ok"
        assert use(foreigner, store, "torch", "closing", timeout=REFUSED_AFTER).startswith("refused")
        assert use(foreigner, store, "ours", "closing-2", SECRET, timeout=REFUSED_AFTER).startswith("refused")
        assert store.ask("has closing") == "False" and store.ask("has closing-2") == "False"
        assert store.ask("has worker-1") == "True"

        # ... was cut off when it closed, and cannot write either.
        out, _ = late.communicate("go\n", timeout=60)
        assert out.strip().startswith("refused"), out
        assert store.ask("has late") == "False"
        # With a secret, a joiner proves it: refused peers are not counted as would-be joiners.
        assert store.ask("knocks") == "-"
    finally:
        store.close()


def test_a_joiner_proving_the_secret_as_the_round_closes_is_heard_out(hosts: Network) -> None:
    """A spare connecting at the moment the round closes (the chaos of a busy host) is halfway
    through its proof when the store is restricted to the round's members: with joiners that
    prove the secret allowed, it finishes the proof and is in, not cut off mid-handshake."""
    server_host, member, joiner = hosts[0], hosts[1], hosts[2]
    store = NamespaceStore(server_host, "10.213.0.0/24", SECRET)
    try:
        midway = subprocess.Popen(
            joiner.argv([sys.executable, "-c", MIDWAY, server_host.addr, str(store.port), SECRET.decode()]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert midway.stdout is not None
        assert midway.stdout.readline().strip() == "challenged"
        assert store.ask(f"restrict-joiners {member.addr}") == "ok"
        out, _ = midway.communicate("go\n", timeout=60)
        assert out.strip() == "ok", out
        assert use(joiner, store, "ours", "joined", SECRET) == "ok"  # and a new one proves it too
    finally:
        logs = store.close()
    assert "has not proven the shared secret" not in logs, logs


def test_a_refused_reader_is_not_taken_for_an_agent_waiting_to_join(hosts: Network) -> None:
    server_host, member, foreigner = hosts[0], hosts[1], hosts[2]
    store = NamespaceStore(server_host, "", None)
    try:
        assert store.ask(f"restrict {member.addr}") == "ok"
        assert use(member, store, "reader", "r") == "ok"  # admitted by address: reads
        # Refused (the round is closed, no secret), and not counted: a job with room for more
        # nodes would otherwise start a new round for it.
        refused = use(foreigner, store, "reader", "r", timeout=REFUSED_AFTER)
        assert refused.startswith("refused") and "does not admit this host" in refused, refused
        assert store.ask("knocks") == "-"
        # The same host as a client that may join: counted.
        assert use(foreigner, store, "ours", "joiner", timeout=REFUSED_AFTER).startswith("refused")
        assert store.ask("knocks") == foreigner.addr
    finally:
        log = store.close()
    assert f"store server refused the reader {foreigner.addr}" in log, log


def test_join_networks_refuse_outsiders_even_with_the_secret(hosts: Network) -> None:
    server_host, inside, outside = hosts[0], hosts[1], hosts[2]
    store = NamespaceStore(server_host, f"{inside.addr}/32", SECRET)
    try:
        assert use(inside, store, "ours", "in", SECRET) == "ok"
        assert use(outside, store, "ours", "out", SECRET, timeout=REFUSED_AFTER).startswith("refused")
        assert store.ask("has out") == "False"
    finally:
        store.close()


def test_restriction_without_a_secret_admits_members_by_address(hosts: Network) -> None:
    server_host, member, foreigner = hosts[0], hosts[1], hosts[2]
    store = NamespaceStore(server_host, "", None)
    try:
        assert use(foreigner, store, "torch", "before") == "ok"  # nothing configured: open
        assert store.ask(f"restrict {member.addr}") == "ok"
        assert store.ask("knocks") == "-"
        assert use(foreigner, store, "torch", "after", timeout=REFUSED_AFTER).startswith("refused")
        assert use(foreigner, store, "ours", "after-2", timeout=REFUSED_AFTER).startswith("refused")
        # The foreigner would be admitted to an open round: it is counted as a would-be joiner
        # (asked at once: a knock counts for KNOCK_WINDOW seconds, and new clients take a while).
        assert store.ask("knocks") == foreigner.addr
        assert use(member, store, "torch", "member") == "ok"
        assert store.ask("has after") == "False" and store.ask("has member") == "True"
        # The store's own host, through its own address rather than loopback: local, admitted.
        assert use(server_host, store, "torch", "self") == "ok"
    finally:
        log = store.close()
    # torch's client retried for seconds, each attempt refused: one line says so.
    assert log.count(f"store server refused {foreigner.addr}") == 1, log


# Keeps trying a store that refuses it, as a joining agent does, until it gets in.
PATIENT = """
import sys, time
from launcher.store.client import TCPStoreClient
start = time.monotonic()
store = TCPStoreClient(sys.argv[1], int(sys.argv[2]), timeout=5, connect_timeout=1, refused_timeout=60)
store.set("patient", b"in")
print("ok", round(time.monotonic() - start, 1), flush=True)
"""


def test_a_refused_client_keeps_trying_until_the_round_reopens(hosts: Network) -> None:
    """An agent that arrives while the round is closed is refused, counted, and gets in once the
    store is opened for a new round, although its connect timeout (1 s) passed long before."""
    server_host, member, joiner = hosts[0], hosts[1], hosts[2]
    store = NamespaceStore(server_host, "", None)
    try:
        assert store.ask(f"restrict {member.addr}") == "ok"
        patient = subprocess.Popen(
            joiner.argv([sys.executable, "-c", PATIENT, server_host.addr, str(store.port)]),
            stdout=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while store.ask("knocks") != joiner.addr:
            assert time.monotonic() < deadline, "the joiner was never refused"
            time.sleep(0.1)
        time.sleep(1.5)  # past its connect timeout: only refused_timeout keeps it going
        assert store.ask("has patient") == "False"
        assert store.ask("open") == "ok"
        out, _ = patient.communicate(timeout=60)
        assert out.startswith("ok"), out
        assert store.ask("has patient") == "True"
    finally:
        store.close()
