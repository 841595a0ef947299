"""What a chaos trial is made of: the job's size and kind, and one fault's spec (plain records,
shared by the plan and the fault catalogue, which import nothing of each other's but these)."""

from __future__ import annotations

from dataclasses import dataclass

#: Job kinds: how many nodes, which backend, which launcher options, which worker mode.
JOB_KINDS = ("elastic-spare", "fixed", "preload", "recoverable", "static")
#: Job kinds drawn only when asked (``job_kinds=`` of the plan, ``benchmarks/chaos.py --job``): left
#: out of :data:`JOB_KINDS`, so the default plans (CI's seed 45 among them) stay what they were.
#: ``segments``: issue 47's ``--topology file:PATH --segment 2 --nnodes 2`` on four hosts under two
#: leaves (h0 and h1 on ``spine0.leaf-a``, h2 and h3 on ``spine0.leaf-b``): one leaf's two nodes
#: train, the other two wait as spares.
EXTRA_JOB_KINDS = ("segments",)
#: Every job kind a plan can be asked for.
ALL_JOB_KINDS = JOB_KINDS + EXTRA_JOB_KINDS
#: Job kinds that need launcher's own options (torchrun runs none of them).
LAUNCHER_ONLY_JOB_KINDS = frozenset({"preload", "recoverable", "segments"})
#: A ``segments`` job's segment size (nodes of one leaf that train together) and its leaves.
SEGMENT = 2
SEGMENT_LEAVES = 2
#: The backend each job kind runs on by default; a campaign asked for etcd runs the c10d kinds over
#: etcd as well (or instead): :func:`job_backends`.
BACKEND_OF = {"elastic-spare": "c10d", "fixed": "c10d", "preload": "c10d", "recoverable": "c10d", "static": "static",
              "segments": "c10d"}
#: Every backend a campaign can draw; etcd jobs need the launcher-etcd plugin and an etcd binary.
BACKENDS = ("c10d", "static", "etcd")
#: The backends a campaign draws unless asked for others (the CI campaign's).
DEFAULT_BACKENDS = ("c10d", "static")
#: Backends whose nodes rendezvous dynamically: spares, late nodes, re-formed rounds.
DYNAMIC_BACKENDS = frozenset({"c10d", "etcd"})
#: Members of an etcd job's cluster, each in a namespace host of its own: one may die, two keep the quorum.
ETCD_MEMBERS = 3


def job_backends(job_kinds: tuple[str, ...], backends: tuple[str, ...]) -> list[tuple[str, str]]:
    """The ``(job kind, backend)`` pairs a campaign over ``backends`` draws from, in a fixed order.

    A kind runs on its own backend (:data:`BACKEND_OF`) where that is one of ``backends``, and a
    c10d kind also on etcd where etcd is: with the default backends the pairs are
    :data:`JOB_KINDS` in order, so the default plan is what it was before etcd jobs existed.
    """
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(BACKENDS)}")
    pairs = []
    for kind in job_kinds:
        for backend in backends:
            if backend == BACKEND_OF[kind] or (backend == "etcd" and BACKEND_OF[kind] == "c10d"):
                pairs.append((kind, backend))
    return pairs


@dataclass(frozen=True)
class Sizes:
    """How big and how long a trial's job is (``light`` for CI: seconds a trial)."""

    hosts: int = 4
    nproc: int = 2
    steps: int = 16
    step_seconds: float = 0.25

    @classmethod
    def light(cls) -> Sizes:
        return cls(hosts=3, nproc=1, steps=10, step_seconds=0.2)


@dataclass(frozen=True)
class JobSpec:
    """One trial's job: ``kind`` decides the options; ``hosts`` namespace hosts, ``active`` started at once."""

    kind: str
    backend: str
    hosts: int
    active: int
    min_nodes: int
    max_nodes: int
    nproc: int
    steps: int
    step_seconds: float
    max_restarts: int = 3
    preload: bool = False
    recoverable: bool = False

    @property
    def nnodes(self) -> str:
        return str(self.max_nodes) if self.min_nodes == self.max_nodes else f"{self.min_nodes}:{self.max_nodes}"

    @property
    def etcd_members(self) -> int:
        """Members of the etcd cluster the job rendezvous on (0: not an etcd job), each in a host of its own."""
        return ETCD_MEMBERS if self.backend == "etcd" else 0

    @property
    def segment(self) -> int:
        """``--segment N`` of the job (0: none). A property of the kind, not a field: the plans'
        JSON (and so the default plans' digests) is what it was before segment jobs."""
        return SEGMENT if self.kind == "segments" else 0

    def domain(self, host: int) -> str:
        """The switch path of ``host`` in the job's site file (``--topology file:``): consecutive
        hosts, :data:`SEGMENT` a leaf, so the store's host 0 is in the first leaf."""
        return f"spine0.leaf-{chr(ord('a') + host // (self.segment or self.hosts))}"

    def whole_segments(self, hosts: set[int] | range) -> int:
        """Nodes in whole segments of one leaf among ``hosts`` (all of them without ``--segment``)."""
        if not self.segment:
            return len(hosts)
        per_leaf: dict[str, int] = {}
        for host in hosts:
            per_leaf[self.domain(host)] = per_leaf.get(self.domain(host), 0) + 1
        return sum(n // self.segment for n in per_leaf.values()) * self.segment

    @property
    def elastic(self) -> bool:
        return self.min_nodes < self.max_nodes or self.active > self.max_nodes or self.hosts > self.max_nodes


@dataclass(frozen=True)
class FaultSpec:
    """One fault of a trial: its kind (a key of :data:`launcher.testing.chaos.faults.CATALOGUE`),
    the host it hits, the local rank (for worker faults), the moment and how long it lasts."""

    kind: str
    #: The victim's host; for ``etcd-member-killed``, the index of the etcd member (its own host).
    host: int
    local_rank: int = 0
    #: Injected once a group has checked this step, ...
    after_step: int = 1
    #: ... plus this many seconds.
    delay: float = 0.0
    #: Seconds until :meth:`heal` (a continued agent, a restored link, netem removed); 0: never.
    duration: float = 0.0
