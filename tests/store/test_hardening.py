"""Hostile clients: reply floods, silent connections, log floods, running out of descriptors."""

from __future__ import annotations

import logging
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from launcher.store.client import TCPStoreClient
from launcher.store.requests import OUTPUT_HARD_LIMIT
from launcher.store.server import VALIDATION_MAGIC, QueryType, StoreServer
from launcher.store.throttle import LogThrottle

from ..conftest import LAUNCHER, launcher_env
from .flood import KEY, VALUE_SIZE, blob, flood, get_request, rss_bytes, watch_peak_rss
from .test_server import is_closed_by_peer, recv_exact

pytestmark = pytest.mark.timeout(180)

MB = 1 << 20
RSS_LIMIT = 300 * MB

# Our server in a child process whose address space is capped, so that a regression (replies
# queued without bound) fails the test with a MemoryError instead of taking the machine down.
CAPPED_SERVER = """
import logging, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
if len(sys.argv) > 2:
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[2])))
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from launcher.store.server import StoreServer
server = StoreServer("127.0.0.1", 0)
server.log_interval = 3600  # one line per kind of trouble, however slow this machine is
server.start()
print(server.port, flush=True)
sys.stdin.read()
print("alive" if server.running else "dead", flush=True)
server.close()
"""


class CappedServer:
    def __init__(self, address_space: int = 1 << 30, nofile: int | None = None) -> None:
        args = [str(address_space)] + ([str(nofile)] if nofile else [])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CAPPED_SERVER, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def stop(self) -> tuple[str, str]:
        out, err = self.proc.communicate("", timeout=30)
        return out, err


def _read_get_reply(sock: socket.socket) -> bytes:
    (n,) = struct.unpack("<Q", recv_exact(sock, 8))
    return recv_exact(sock, n)


def test_pipelined_get_flood_keeps_memory_bounded() -> None:
    server = CappedServer()
    socks: list[socket.socket] = []
    try:
        # ~36,000 GETs of a 1 MiB value per connection: 36 GiB of replies if they were queued.
        socks = [flood("127.0.0.1", server.port, 400_000) for _ in range(3)]
        # The server still serves everybody else.
        with TCPStoreClient("127.0.0.1", server.port, timeout=30) as client:
            client.set("k", b"v")
            assert client.get("k") == b"v"
        peak = rss_bytes(server.proc.pid, "VmHWM")
        print(f"FIGURE case=get-flood-server peak_rss_mb={peak / MB:.1f} limit_mb={RSS_LIMIT / MB:.0f}")
        assert 0 < peak < RSS_LIMIT, f"server peak RSS {peak / MB:.0f} MB"
        # The flooders' replies are intact, in order, once they read.
        for sock in socks:
            sock.settimeout(30)
            for _ in range(3):
                assert _read_get_reply(sock) == b"x" * VALUE_SIZE
    finally:
        for sock in socks:
            sock.close()
        out, err = server.stop()
    assert out.strip() == "alive", err


def test_paused_connection_answers_every_request_after_catching_up(server: StoreServer) -> None:
    server.store.set(KEY.decode()[1:], b"y" * VALUE_SIZE)
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(struct.pack("<BI", QueryType.VALIDATE, VALIDATION_MAGIC))
        # 40 MiB of replies: far past the high-water mark, so the server pauses this connection.
        sock.sendall(get_request() * 40 + struct.pack("<BI", QueryType.PING, 1234))
        time.sleep(0.5)
        for _ in range(40):
            assert _read_get_reply(sock) == b"y" * VALUE_SIZE
        assert struct.unpack("<I", recv_exact(sock, 4))[0] == 1234


def test_a_reply_past_the_hard_limit_closes_the_connection(server: StoreServer) -> None:
    server.store.set("big", b"z" * VALUE_SIZE)
    copies = OUTPUT_HARD_LIMIT // VALUE_SIZE + 1
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(struct.pack("<BI", QueryType.VALIDATE, VALIDATION_MAGIC))
        sock.sendall(bytes([QueryType.MULTI_GET]) + struct.pack("<Q", copies) + blob(b"/big") * copies)
        assert is_closed_by_peer(sock, within=30)
    with TCPStoreClient(server.host, server.port, timeout=10) as client:
        assert client.get("big") == b"z" * VALUE_SIZE


def test_silent_connection_is_closed_after_the_handshake_timeout(server: StoreServer) -> None:
    server.handshake_timeout = 0.5
    silent = socket.create_connection((server.host, server.port), timeout=10)
    talker = socket.create_connection((server.host, server.port), timeout=10)
    talker.sendall(struct.pack("<BI", QueryType.VALIDATE, VALIDATION_MAGIC))
    try:
        assert is_closed_by_peer(silent, within=30)
        # A validated connection is not subject to the timeout.
        talker.sendall(struct.pack("<BI", QueryType.PING, 77))
        assert struct.unpack("<I", recv_exact(talker, 4))[0] == 77
    finally:
        silent.close()
        talker.close()


def test_bad_validation_is_logged_once_per_peer(server: StoreServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="launcher.store.server")
    server.log_interval = 3600  # however slow this machine, the loop below fits in one interval
    for _ in range(200):
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            sock.sendall(b"\x00\xde\xad\xbe\xef")
            assert is_closed_by_peer(sock, within=10)
    lines = [r for r in caplog.records if "not a TCPStore client" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "127.0.0.1" in lines[0].getMessage()


def test_log_throttle_counts_what_it_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    throttle = LogThrottle(logging.getLogger("throttle-test"), interval=60.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="throttle-test")
    assert throttle.log(logging.INFO, "peer-a", "bad thing from %s", "a")
    for _ in range(5):
        assert not throttle.log(logging.INFO, "peer-a", "bad thing from %s", "a")
    assert throttle.log(logging.INFO, "peer-b", "bad thing from %s", "b")  # other peers are separate
    now[0] += 61
    assert throttle.log(logging.INFO, "peer-a", "bad thing from %s", "a")
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "bad thing from a" and messages[1] == "bad thing from b"
    assert messages[2].startswith("bad thing from a (5 similar messages suppressed")


def test_out_of_descriptors_backs_off_and_recovers() -> None:
    server = CappedServer(nofile=32)
    socks: list[socket.socket] = []
    try:
        for _ in range(60):  # more than the server can hold: later ones wait in the backlog
            socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        time.sleep(3)  # the server meets EMFILE again and again meanwhile
        for sock in socks:
            sock.close()
        socks.clear()
        with TCPStoreClient("127.0.0.1", server.port, timeout=60) as client:
            client.set("k", b"v")
            assert client.get("k") == b"v"
    finally:
        for sock in socks:
            sock.close()
        out, err = server.stop()
    assert out.strip() == "alive", err
    assert err.count("cannot accept connections") == 1, err


WORKER = textwrap.dedent(
    """
    import datetime, os, sys, time
    from pathlib import Path
    import torch
    import torch.distributed as dist

    shared = Path(sys.argv[1])
    if os.environ["RANK"] == "0":
        (shared / "port.tmp").write_text(os.environ["MASTER_PORT"])
        (shared / "port.tmp").rename(shared / "port")
    deadline = time.monotonic() + 120
    while not (shared / "go").exists():
        if time.monotonic() > deadline:
            sys.exit("no go signal")
        time.sleep(0.05)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    assert t.item() == 3.0, t.item()
    dist.barrier()
    print(f"rank {dist.get_rank()} done", flush=True)
    dist.destroy_process_group()
    """
)


def test_real_job_finishes_while_its_store_is_flooded(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = launcher_env({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    agent = subprocess.Popen(
        [*LAUNCHER, "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    socks: list[socket.socket] = []
    try:
        port_file = tmp_path / "port"
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert agent.poll() is None and time.monotonic() < deadline, "workers never started"
            time.sleep(0.05)
        port = int(port_file.read_text())
        socks = [flood("127.0.0.1", port, 400_000) for _ in range(3)]
        (tmp_path / "go").write_text("")
        peak = watch_peak_rss(agent.pid, until=time.monotonic() + 150)
        out, _ = agent.communicate(timeout=30)
    finally:
        for sock in socks:
            sock.close()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    print(f"FIGURE case=get-flood-agent peak_rss_mb={peak / MB:.1f} limit_mb={RSS_LIMIT / MB:.0f}")
    assert agent.returncode == 0, out
    assert "rank 0 done" in out and "rank 1 done" in out, out
    assert 0 < peak < RSS_LIMIT, f"agent peak RSS {peak / MB:.0f} MB"
