"""Several "hosts" on one machine: Linux network namespaces joined by a private bridge.

Layout of one :class:`Network` (``<p>`` is the run prefix ``lmn-<pid>-<n>``)::

    netns <p>-sw  (the switch: a bridge "br0", nothing else; no address, no route)
       ├── port "h0" ══ veth ══ "veth0" in netns <p>-h0   10.213.0.1/24  fd00:213::1/64
       ├── port "h1" ══ veth ══ "veth0" in netns <p>-h1   10.213.0.2/24  fd00:213::2/64
       └── ...

Every interface is created *inside* the namespaces (``ip -n SW link add ... peer ... netns HOST``),
so the root namespace is never touched: no bridge, no veth, no address and no route is added
there, and nothing a test sends can leave the machine. Each host has only its loopback and its
veth (no default route), so a host reaches exactly the other hosts of its network.

Namespace names carry the pid of the process that made them, so parallel runs never clash, and
:func:`cleanup_stale` removes the namespaces of runs whose process no longer exists (a crashed or
killed pytest). :meth:`Network.destroy` kills every process still inside the namespaces before it
deletes them: a namespace with a live process would otherwise outlive its deletion.

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's ``ip``; :func:`unavailable_reason`
says why not when it cannot work here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = [
    "PREFIX",
    "Host",
    "Network",
    "NetnsError",
    "cleanup_stale",
    "list_namespaces",
    "namespace_pids",
    "unavailable_reason",
]

#: Every namespace this module makes is named ``lmn-<pid>-<n>-<role>``.
PREFIX = "lmn"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-(sw|h\d+)$")
#: The interface of a host, inside its namespace (``GLOO_SOCKET_IFNAME``).
HOST_IFNAME = "veth0"
IPV4_NET = "10.213.0"
IPV6_NET = "fd00:213:"
_counter = itertools.count()


class NetnsError(RuntimeError):
    """An ``ip`` command failed while building or changing the network."""


def _ip(*args: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def list_namespaces() -> list[str]:
    """Names of every network namespace (``ip netns list``), without their ids."""
    result = _ip("netns", "list", check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def namespace_pids(netns: str) -> list[int]:
    """Processes whose network namespace is ``netns`` (``ip netns pids``)."""
    result = _ip("netns", "pids", netns, check=False)
    return [int(word) for word in result.stdout.split() if word.isdigit()]


def _kill_namespace(netns: str) -> None:
    """SIGKILL every process in ``netns`` (repeatedly: a dying parent may still fork), then delete it."""
    for _ in range(50):
        pids = [pid for pid in namespace_pids(netns) if pid != os.getpid()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    _ip("netns", "del", netns, check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Delete the namespaces left by runs whose process is gone; the names removed."""
    removed = []
    for name in list_namespaces():
        match = _NAME.match(name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            _kill_namespace(name)
            removed.append(name)
    return removed


_reason: str | None = None
_checked = False


def unavailable_reason() -> str | None:
    """Why namespace hosts cannot be built here (``None`` when they can); checked once."""
    global _reason, _checked
    if _checked:
        return _reason
    _checked = True
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        _reason = "multi-node tests need root (they create network namespaces)"
    elif shutil.which("ip") is None:
        _reason = "multi-node tests need iproute2's 'ip' (apt-get install iproute2)"
    else:
        probe = f"{PREFIX}-{os.getpid()}-{next(_counter)}-sw"
        try:
            _ip("netns", "add", probe)
            _ip("-n", probe, "link", "add", "br0", "type", "bridge")
            _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        except (NetnsError, OSError, subprocess.SubprocessError) as exc:
            _reason = f"cannot create network namespaces, bridges or veth pairs here: {exc}"
        finally:
            _ip("netns", "del", probe, check=False)
    return _reason


@dataclass
class Host:
    """One namespace host: its own loopback and one veth on the network's bridge."""

    index: int
    netns: str
    network: Network
    ipv4: str | None = None
    ipv6: str | None = None
    #: The host's interface, inside its namespace (what ``GLOO_SOCKET_IFNAME`` names).
    ifname: str = HOST_IFNAME
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"h{self.index}"

    @property
    def port(self) -> str:
        """The bridge port (switch side of the veth) of this host."""
        return self.name

    @property
    def addr(self) -> str:
        """This host's address: IPv4 when it has one, else IPv6 (without brackets)."""
        addr = self.ipv4 or self.ipv6
        assert addr is not None
        return addr

    def endpoint(self, port: int) -> str:
        """``addr:port``, IPv6 in brackets."""
        return f"[{self.addr}]:{port}" if ":" in self.addr else f"{self.addr}:{port}"

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside this host (``ip netns exec``, which execs it: same pid)."""
        return ["ip", "netns", "exec", self.netns, *command]

    def run(self, command: Sequence[str], *, timeout: float = 30.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``command`` inside this host to completion (output captured, as text)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.argv(command), timeout=timeout, **kwargs)

    def popen(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdout: IO[Any] | int | None = None,
        stderr: IO[Any] | int | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.Popen[Any]:
        """Start ``command`` inside this host in its own session; killed by :meth:`Network.destroy`."""
        process = subprocess.Popen(
            self.argv(command),
            env=dict(env) if env is not None else None,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def pids(self) -> list[int]:
        """Every process now inside this host."""
        return namespace_pids(self.netns)

    def kill_all(self, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to every process inside this host (a host crash, for SIGKILL)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def cut(self) -> None:
        """Pull this host's cable: its bridge port goes down, every packet to and from it is lost.

        Its processes keep running and its own interface stays configured (NO-CARRIER), as when
        a switch port or a link fails; no connection is reset.
        """
        _ip("-n", self.network.switch, "link", "set", self.port, "down")

    def restore(self) -> None:
        """Plug the cable back in (undo :meth:`cut`)."""
        _ip("-n", self.network.switch, "link", "set", self.port, "up")

    def is_cut(self) -> bool:
        out = _ip("-n", self.network.switch, "-o", "link", "show", self.port).stdout
        flags = out[out.find("<") + 1 : out.find(">")].split(",")
        return "UP" not in flags


class Network:
    """``n`` hosts on one bridge; use as a context manager, or call :meth:`create` / :meth:`destroy`.

    ``ipv4``/``ipv6`` choose the address families: IPv4 ``10.213.0.<i+1>/24`` and IPv6 ULA
    ``fd00:213::<i+1>/64`` (without duplicate address detection, so they work at once).
    """

    def __init__(self, n: int, *, ipv4: bool = True, ipv6: bool = False) -> None:
        if not 1 <= n <= 200:
            raise ValueError("a network has 1 to 200 hosts")
        if not (ipv4 or ipv6):
            raise ValueError("a network needs IPv4 or IPv6 addresses")
        self.prefix = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.switch = f"{self.prefix}-sw"
        self.hosts = [
            Host(
                index=i,
                netns=f"{self.prefix}-h{i}",
                network=self,
                ipv4=f"{IPV4_NET}.{i + 1}" if ipv4 else None,
                ipv6=f"{IPV6_NET}:{i + 1}" if ipv6 else None,
            )
            for i in range(n)
        ]
        self._created: list[str] = []

    def __enter__(self) -> Network:
        self.create()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.destroy()

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __len__(self) -> int:
        return len(self.hosts)

    def create(self) -> None:
        """Build the switch and the hosts; on any failure, remove what was built and raise."""
        try:
            self._add_netns(self.switch)
            sw = ("-n", self.switch)
            _ip(*sw, "link", "set", "lo", "up")
            _ip(*sw, "link", "add", "br0", "type", "bridge")
            # No STP and no forwarding delay: a port forwards the moment it is up.
            _ip(*sw, "link", "set", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
            _ip(*sw, "link", "set", "br0", "up")
            for host in self.hosts:
                self._add_host(host)
            for host in self.hosts:
                self._wait_ready(host)
        except BaseException:
            self.destroy()
            raise

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)

    def _add_host(self, host: Host) -> None:
        self._add_netns(host.netns)
        sw = ("-n", self.switch)
        hn = ("-n", host.netns)
        # Both ends are created in the switch namespace's view and the host end is moved straight
        # into the host namespace: no name ever appears in the root namespace.
        _ip(*sw, "link", "add", host.port, "type", "veth", "peer", "name", host.ifname, "netns", host.netns)
        _ip(*sw, "link", "set", host.port, "master", "br0")
        _ip(*sw, "link", "set", host.port, "up")
        _ip(*hn, "link", "set", "lo", "up")
        if host.ipv4:
            _ip(*hn, "addr", "add", f"{host.ipv4}/24", "dev", host.ifname)
        if host.ipv6:
            _ip(*hn, "-6", "addr", "add", f"{host.ipv6}/64", "dev", host.ifname, "nodad")
        _ip(*hn, "link", "set", host.ifname, "up")

    def _wait_ready(self, host: Host, timeout: float = 10.0) -> None:
        """Wait until the host's interface is up with its addresses usable (not tentative)."""
        deadline = time.monotonic() + timeout
        while True:
            out = _ip("-n", host.netns, "-o", "addr", "show", "dev", host.ifname).stdout
            link = _ip("-n", host.netns, "-o", "link", "show", host.ifname).stdout
            ready = "LOWER_UP" in link and "tentative" not in out
            ready = ready and (not host.ipv4 or host.ipv4 + "/" in out) and (not host.ipv6 or host.ipv6 + "/" in out)
            if ready:
                return
            if time.monotonic() >= deadline:
                raise NetnsError(f"host {host.netns} not ready after {timeout:g} s: {link.strip()} {out.strip()}")
            time.sleep(0.05)

    def destroy(self) -> None:
        """Kill every process started in the hosts (and anything else inside them), delete the namespaces.

        Safe to call twice and after a partial :meth:`create`; never raises for a missing piece.
        """
        for host in self.hosts:
            for process in host.processes:
                if process.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)
        for name in reversed(self._created):
            _kill_namespace(name)
        for host in self.hosts:
            for process in host.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
        self._created.clear()
