"""The namespace hosts themselves: isolation, reachability, link cuts, clean-up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.multinode.netns import PREFIX, Network, cleanup_stale, list_namespaces

pytestmark = [pytest.mark.netns]

CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()\n"
    "    print('connected')\n"
    "except OSError as exc:\n"
    "    print(type(exc).__name__, exc.errno)\n"
)
LISTEN = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)\n"
    "s.bind((sys.argv[1], 0)); s.listen(); print(s.getsockname()[1], flush=True)\n"
    "while True:\n"
    "    s.accept()[0].close()\n"
)


def connect(host, addr: str, port: int, timeout: float = 1.0) -> str:
    return host.run([sys.executable, "-c", CONNECT, addr, str(port), str(timeout)], timeout=10).stdout.strip()


def root_links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_hosts_reach_each_other_and_nothing_else(make_network, family):
    before = root_links()
    net = make_network(2, ipv4=family == "ipv4", ipv6=family == "ipv6")
    # Nothing was added to the root namespace: the bridge and every veth live in the namespaces.
    assert root_links() == before
    server = net[0].popen([sys.executable, "-u", "-c", LISTEN, net[0].addr], stdout=subprocess.PIPE)
    port = int(server.stdout.readline())
    assert connect(net[1], net[0].addr, port) == "connected"
    # Each host has loopback and its veth, and no route anywhere else.
    lo = net[1].run(["ip", "-o", "link", "show", "lo"]).stdout
    assert "UP" in lo[lo.find("<") + 1 : lo.find(">")].split(","), lo
    assert sorted(net[1].run(["ls", "/sys/class/net"]).stdout.split()) == ["lo", "veth0"]
    outside = "192.0.2.1" if family == "ipv4" else "2001:db8::1"  # documentation addresses
    assert connect(net[1], outside, 80).startswith("OSError 101")  # ENETUNREACH: no route
    # A cut link loses packets silently (connect times out), and comes back when restored.
    net[0].cut()
    assert net[0].is_cut()
    assert connect(net[1], net[0].addr, port, timeout=1.0).startswith(("TimeoutError", "OSError 113"))
    net[0].restore()
    assert not net[0].is_cut()
    assert connect(net[1], net[0].addr, port, timeout=5.0) == "connected"


@pytest.mark.timeout(60)
def test_destroy_kills_processes_and_removes_namespaces():
    net = Network(2)
    net.create()
    sleeper = net[1].popen(["sleep", "300"])
    # A process the test did not start (a worker's child, say) is found by its namespace.
    net[0].run(["sh", "-c", "sleep 300 >/dev/null 2>&1 &"])
    assert net[0].pids() and net[1].pids() == [sleeper.pid]
    net.destroy()
    assert sleeper.poll() is not None
    assert not [name for name in list_namespaces() if name.startswith(net.prefix)]
    net.destroy()  # twice is harmless


@pytest.mark.timeout(60)
def test_stale_namespaces_of_dead_runs_are_removed():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = f"{PREFIX}-{int(dead.stdout)}-0-h0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    with Network(1) as live:
        removed = cleanup_stale()
        names = list_namespaces()
        assert stale in removed and stale not in names
        # This run's namespaces stay.
        assert live[0].netns in names and live.switch in names
