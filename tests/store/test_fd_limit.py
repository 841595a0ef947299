"""The store host raises its open-files limit to what the nodes need, or says at once that it cannot.

Each case runs the server in a child process whose limits are set before it starts (a
``preexec_fn``), so the test process keeps its own.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import launcher_env

pytestmark = pytest.mark.timeout(120)

# Serves with room for ``clients`` (argv[1]); prints the soft limit it ends up with.
SERVER = textwrap.dedent(
    """
    import logging, resource, sys
    from launcher.store.server import StoreServer

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    with StoreServer("127.0.0.1", 0, clients=int(sys.argv[1])) as server:
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], flush=True)
    """
)

# The c10d backend's host, as the agent builds it: --nnodes 1:MAX (argv[1]), this node serves.
C10D_HOST = textwrap.dedent(
    """
    import logging, resource, sys
    from launcher.rendezvous.api import RendezvousParameters
    from launcher.rendezvous.c10d import create_handler

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    params = RendezvousParameters("c10d", "127.0.0.1:0", "fd-limit", 1, int(sys.argv[1]), "127.0.0.1",
                                  {"is_host": "1"})
    handler = create_handler(params)
    print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], flush=True)
    handler.shutdown()
    """
)


def _limited(soft: int, hard: int) -> object:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


def _run(script: str, clients: int, soft: int, hard: int) -> tuple[int, list[str]]:
    """The soft limit the server ended up with, and its log lines that speak of the limit."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(clients)],
        capture_output=True,
        text=True,
        timeout=90,
        env=launcher_env(),
        preexec_fn=_limited(soft, hard),  # noqa: PLW1509 - only setrlimit, before exec
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1]), [line for line in done.stderr.splitlines() if "ulimit -Hn" in line]


def _hard_limit_allows(n: int) -> bool:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return hard == resource.RLIM_INFINITY or hard >= n


def test_a_low_hard_limit_is_named_once_at_the_start() -> None:
    soft, lines = _run(SERVER, 2000, 256, 1024)
    assert soft == 1024  # raised as far as it goes
    assert len(lines) == 1, lines
    assert "only 1024 files" in lines[0] and "2000 nodes" in lines[0]
    assert lines[0].startswith("WARNING ")


def test_the_soft_limit_is_raised_to_what_the_nodes_need() -> None:
    if not _hard_limit_allows(8192):
        pytest.skip("this machine's hard open-files limit is below 8192")
    soft, lines = _run(SERVER, 5000, 256, 8192)
    assert soft >= 5000
    assert lines == []


def test_enough_room_says_nothing() -> None:
    _, lines = _run(SERVER, 100, 256, 1024)
    assert lines == []


def test_the_c10d_host_sizes_the_limit_by_the_nodes_maximum() -> None:
    soft, lines = _run(C10D_HOST, 3000, 512, 1024)
    assert soft == 1024
    assert len(lines) == 1 and "3000 nodes" in lines[0], lines
    _, lines = _run(C10D_HOST, 8, 512, 1024)
    assert lines == []
