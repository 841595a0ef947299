"""Fixtures for the store tests: our server in-process or in a child process, torch's clients."""

from __future__ import annotations

import datetime
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from launcher.store.server import StoreServer

# A child process serving our store: prints its port, serves until stdin closes.
SERVE_SCRIPT = """
import sys
from launcher.store.server import StoreServer
server = StoreServer(sys.argv[1]).start()
print(server.port, flush=True)
sys.stdin.read()
server.close()
"""


def has_ipv6_loopback() -> bool:
    """Whether ``::1`` can be bound here."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture
def server() -> Iterator[StoreServer]:
    """Our server, in this process, on 127.0.0.1 and a kernel-chosen port."""
    srv = StoreServer("127.0.0.1", 0).start()
    try:
        yield srv
    finally:
        srv.close()


class ServerProcess:
    """Our server in a child process.

    Some of torch's ``TCPStore`` calls (``list_keys``, the queue calls) hold the GIL while they
    block on the socket, so a torch client and our server must not share a process for those.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE_SCRIPT, host],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip():
            self.proc.kill()
            raise RuntimeError("store server process did not start")
        self.port = int(line)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            self.proc.kill()
            self.proc.wait()
        assert self.proc.returncode == 0, "store server process failed"


@pytest.fixture
def server_proc() -> Iterator[ServerProcess]:
    """Our server in a child process on 127.0.0.1."""
    proc = ServerProcess()
    try:
        yield proc
    finally:
        proc.close()


@pytest.fixture(scope="session")
def dist() -> Any:
    """``torch.distributed`` (imported once per session; skips when torch is missing)."""
    return pytest.importorskip("torch.distributed")


@pytest.fixture
def torch_client(dist: Any) -> Callable[..., Any]:
    """``torch_client(host, port, timeout=5.0)``: torch's own TCPStore client, as workers make it
    under ``TORCHELASTIC_USE_AGENT_STORE`` (``is_master=False``)."""

    def make(host: str, port: int, timeout: float = 5.0, **kwargs: Any) -> Any:
        return dist.TCPStore(
            host,
            port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
            **kwargs,
        )

    return make
