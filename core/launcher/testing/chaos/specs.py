"""What a chaos trial is made of: the job's size and kind, and one fault's spec (plain records,
shared by the plan and the fault catalogue, which import nothing of each other's but these)."""

from __future__ import annotations

from dataclasses import dataclass

#: Job kinds: how many nodes, which backend, which launcher options, which worker mode.
JOB_KINDS = ("elastic-spare", "fixed", "preload", "recoverable", "static")
#: Backends each job kind runs on (etcd is not run by this harness yet: docs/chaos.md).
BACKEND_OF = {"elastic-spare": "c10d", "fixed": "c10d", "preload": "c10d", "recoverable": "c10d", "static": "static"}


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
    def elastic(self) -> bool:
        return self.min_nodes < self.max_nodes or self.active > self.max_nodes or self.hosts > self.max_nodes


@dataclass(frozen=True)
class FaultSpec:
    """One fault of a trial: its kind (a key of :data:`launcher.testing.chaos.faults.CATALOGUE`),
    the host it hits, the local rank (for worker faults), the moment and how long it lasts."""

    kind: str
    host: int
    local_rank: int = 0
    #: Injected once a group has checked this step, ...
    after_step: int = 1
    #: ... plus this many seconds.
    delay: float = 0.0
    #: Seconds until :meth:`heal` (a continued agent, a restored link, netem removed); 0: never.
    duration: float = 0.0
