"""What a cluster environment reports (:class:`ClusterInfo`), and the helpers detectors share."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from launcher.addresses import lookup_name
from launcher.errors import UsageError

#: Ports derived from a job id fall in ``[PORT_BASE, PORT_BASE + PORT_SPAN)``: below the usual
#: ephemeral range (32768 and up on Linux), above the well-known and most registered services.
PORT_BASE = 15000
PORT_SPAN = 15000


class ClusterError(UsageError):
    """The environment is a scheduler's, but the launcher was started in a way that cannot work."""


@dataclass(frozen=True)
class ClusterInfo:
    """What a scheduler's environment says about this job, as seen from this node.

    Every field but ``scheduler`` and ``job`` may be ``None``: the environment does not say it.
    Every node of a job must derive the same ``nnodes``, ``master_addr``, ``master_port``,
    ``run_id`` and ``backend``, and a distinct ``node_rank`` in ``0..nnodes-1``.

    ``backend`` is the rendezvous that suits what is known: ``static`` when the node's rank is
    known, ``c10d`` when only a shared endpoint is (any node on the endpoint's host serves it).
    ``sources`` says, per field name, which variable(s) a value came from (for the line the
    agent prints). ``problem`` is one line saying why a value is missing and how to start the
    launcher instead (e.g. several launchers on one node); it is raised when that value is needed.
    """

    scheduler: str
    job: str = ""
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    nproc_per_node: int | None = None
    backend: str = "static"
    sources: dict[str, str] = field(default_factory=dict)
    problem: str | None = None

    def __post_init__(self) -> None:
        if self.nnodes is not None and self.nnodes < 1:
            raise ValueError(f"{self.scheduler}: nnodes must be at least 1, got {self.nnodes}")
        if self.node_rank is not None and self.nnodes is not None and not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"{self.scheduler}: node rank {self.node_rank} is outside 0..{self.nnodes - 1}")
        if self.master_port is not None and not 0 < self.master_port <= 65535:
            raise ValueError(f"{self.scheduler}: port {self.master_port} is outside 1..65535")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise ValueError(f"{self.scheduler}: nproc_per_node must be at least 1, got {self.nproc_per_node}")

    @property
    def label(self) -> str:
        """``Slurm job 1234``: how messages name the job."""
        return f"{self.scheduler} {self.job}".strip()


def derived_port(job_id: str) -> int:
    """A port every node of job ``job_id`` computes alike: ``15000 + job id mod 15000``.

    A numeric id maps directly, so consecutive jobs get consecutive ports; any other id is hashed
    (CRC-32, stable across machines and Python versions, unlike ``hash``).
    """
    text = job_id.strip()
    number = int(text) if text.isascii() and text.isdigit() else zlib.crc32(text.encode())
    return PORT_BASE + number % PORT_SPAN


def env_int(environ: Mapping[str, str], name: str) -> int | None:
    """``int(environ[name])``, or ``None`` when the variable is unset or not ASCII decimal digits."""
    text = environ.get(name, "").strip()
    # isascii(): str.isdigit() also accepts digits of other scripts ("٣", "²").
    return int(text) if text.isascii() and text.isdigit() else None


def resolves(host: str) -> bool:
    """Whether ``host`` resolves to an address here (a name in DNS or /etc/hosts, or an address)."""
    import socket

    try:
        return bool(socket.getaddrinfo(lookup_name(host), None, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):
        return False
