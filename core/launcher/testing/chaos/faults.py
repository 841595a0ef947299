"""The fault catalogue: one small class per kind, each with ``inject()`` and, where it applies, ``heal()``.

A fault acts through a :class:`Target` (what the runner gives it: the hosts, the agents, the
workers' pids, a way to start one more agent), so the catalogue knows nothing of how hosts are
made. Each class also says, for the invariants, what its victim may do: whether the victim's
agent may exit non-zero (``strikes_agent``), whether it fails a rank whose report must name it
(``fails_rank``), and whether the job must still finish (:meth:`Fault.survivable`).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from launcher.testing.chaos.specs import DYNAMIC_BACKENDS, ETCD_MEMBERS, FaultSpec, JobSpec


class Target(Protocol):
    """What a fault may act on (the runner's side of the interface)."""

    def agent_pid(self, host: int) -> int | None:
        """The pid of the agent on ``host`` (``None``: none started there)."""

    def worker_pid(self, host: int, local_rank: int) -> int | None:
        """The pid of the newest live worker of ``host`` with that local rank."""

    def host_run(self, host: int, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run ``command`` inside ``host`` to completion."""

    def cut(self, host: int) -> None: ...

    def restore(self, host: int) -> None: ...

    def start_agent(self, host: int) -> None:
        """Start the trial's agent on ``host`` (one not started with the others)."""

    def make_sick(self, host: int) -> None:
        """Make ``host``'s health-check command fail from now on."""

    def fill_log_dir(self, host: int) -> None:
        """Fill the file system of ``host``'s log directory."""

    def kill_etcd_member(self, member: int) -> None:
        """SIGKILL member ``member`` of the etcd cluster the job rendezvous on (etcd jobs only)."""


def _signal(pid: int | None, signum: int) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


class Fault:
    """One kind of fault. Subclasses set the class attributes and :meth:`inject` (and :meth:`heal`)."""

    kind: ClassVar[str]
    #: What the fault does, in a few words (docs/chaos.md's table).
    summary: ClassVar[str]
    #: Needs an option torchrun does not have (it is left out of torchrun's campaign).
    needs_launcher: ClassVar[bool] = False
    #: The victim host's agent may exit non-zero (it was killed, signalled, frozen or cut off).
    strikes_agent: ClassVar[bool] = True
    #: The fault fails one rank: every report's root cause must name that rank's node and rank.
    fails_rank: ClassVar[bool] = False
    #: The fault takes away the victim node (the job must then do with the others).
    loses_node: ClassVar[bool] = True
    #: The fault takes away the store (the job may fail).
    loses_store: ClassVar[bool] = False
    #: ``(low, high)`` seconds the fault lasts before :meth:`heal` (``None``: not healed).
    lasts: ClassVar[tuple[float, float] | None] = None

    @classmethod
    def applies(cls, job: JobSpec) -> bool:
        return True

    @classmethod
    def victim_hosts(cls, job: JobSpec) -> Sequence[int]:
        """Hosts the victim is drawn from: by default, an active node other than the store's."""
        return range(1, job.active)

    @classmethod
    def plan(cls, rng: random.Random, job: JobSpec, after_step: int, *, host: int | None = None) -> FaultSpec:
        """Draw the victim and the moment for ``job`` (``host`` given: that host)."""
        victim = host if host is not None else rng.choice(list(cls.victim_hosts(job)))
        local_rank = rng.randrange(job.nproc)
        duration = round(rng.uniform(*cls.lasts), 1) if cls.lasts else 0.0
        return FaultSpec(kind=cls.kind, host=victim, local_rank=local_rank, after_step=after_step,
                         delay=round(rng.uniform(0.0, 1.0), 2), duration=duration)

    @classmethod
    def initial_hosts(cls, job: JobSpec) -> list[int]:
        """The hosts whose agents start together, before any fault."""
        return list(range(job.active))

    @classmethod
    def survivable(cls, job: JobSpec, spec: FaultSpec) -> bool:
        """MIN nodes and the store survive: the job must finish, with an uninterrupted run's result."""
        if cls.loses_store or (spec.host == 0 and cls.loses_node):
            return False
        if cls.loses_node:
            return job.elastic and job.backend != "static" and job.active - 1 >= job.min_nodes
        return True

    def inject(self, target: Target, spec: FaultSpec) -> None:
        raise NotImplementedError

    def heal(self, target: Target, spec: FaultSpec) -> None:
        """Undo the fault (called ``spec.duration`` seconds after :meth:`inject`, when it lasts)."""


class KillAgent(Fault):
    kind = "kill-agent"
    summary = "SIGKILL of a node's agent (its workers are orphaned)"

    def inject(self, target: Target, spec: FaultSpec) -> None:
        _signal(target.agent_pid(spec.host), signal.SIGKILL)


class KillStoreAgent(KillAgent):
    kind = "kill-store-agent"
    summary = "SIGKILL of the agent of the host that serves the c10d store"
    loses_store = True

    @classmethod
    def applies(cls, job: JobSpec) -> bool:
        return job.backend == "c10d"

    @classmethod
    def victim_hosts(cls, job: JobSpec) -> Sequence[int]:
        return [0]


class TermAgent(Fault):
    kind = "term-agent"
    summary = "SIGTERM of a node's agent (it stops its workers and exits 143)"

    def inject(self, target: Target, spec: FaultSpec) -> None:
        _signal(target.agent_pid(spec.host), signal.SIGTERM)


class KillWorker(Fault):
    kind = "kill-worker"
    summary = "SIGKILL of one worker (a rank dies; the job restarts)"
    strikes_agent = False
    fails_rank = True
    loses_node = False

    @classmethod
    def victim_hosts(cls, job: JobSpec) -> Sequence[int]:
        """With ``--segment``, a node of the store's leaf (the round prefers it: it trains at first),
        not a spare, which has no worker to kill."""
        if job.segment:
            return [h for h in range(1, job.active) if job.domain(h) == job.domain(0)]
        return super().victim_hosts(job)

    def inject(self, target: Target, spec: FaultSpec) -> None:
        _signal(target.worker_pid(spec.host, spec.local_rank), signal.SIGKILL)


class StopWorker(KillWorker):
    kind = "stop-worker"
    summary = "SIGSTOP of one worker (a hang: --hang-timeout names it)"

    def inject(self, target: Target, spec: FaultSpec) -> None:
        _signal(target.worker_pid(spec.host, spec.local_rank), signal.SIGSTOP)


class PauseAgent(Fault):
    kind = "pause-agent"
    summary = "SIGSTOP of an agent, SIGCONT after a few seconds (its workers train on)"
    lasts = (3.0, 15.0)
    loses_node = False

    def inject(self, target: Target, spec: FaultSpec) -> None:
        _signal(target.agent_pid(spec.host), signal.SIGSTOP)

    def heal(self, target: Target, spec: FaultSpec) -> None:
        _signal(target.agent_pid(spec.host), signal.SIGCONT)


class CutLink(Fault):
    kind = "cut-link"
    summary = "a host's link cut, restored after a few seconds"
    lasts = (2.0, 20.0)

    def inject(self, target: Target, spec: FaultSpec) -> None:
        target.cut(spec.host)

    def heal(self, target: Target, spec: FaultSpec) -> None:
        target.restore(spec.host)


class Netem(Fault):
    kind = "netem"
    summary = "10 % packet loss and 50 ms delay on one host (tc netem), removed after a while"
    lasts = (3.0, 10.0)
    strikes_agent = False
    loses_node = False
    ifname: ClassVar[str] = "veth0"

    def inject(self, target: Target, spec: FaultSpec) -> None:
        result = target.host_run(spec.host, ["tc", "qdisc", "add", "dev", self.ifname, "root", "netem",
                                             "loss", "10%", "delay", "50ms"])
        if result.returncode != 0:
            raise RuntimeError(f"tc netem failed: {result.stderr.strip()}")

    def heal(self, target: Target, spec: FaultSpec) -> None:
        target.host_run(spec.host, ["tc", "qdisc", "del", "dev", self.ifname, "root"])


class LateSpare(Fault):
    kind = "late-spare"
    summary = "the spare's agent starts after the round formed (it must wait as a spare, then exit 0)"
    strikes_agent = False
    loses_node = False

    @classmethod
    def applies(cls, job: JobSpec) -> bool:
        return job.backend in DYNAMIC_BACKENDS and job.active > job.max_nodes

    @classmethod
    def victim_hosts(cls, job: JobSpec) -> Sequence[int]:
        return [job.active - 1]

    @classmethod
    def initial_hosts(cls, job: JobSpec) -> list[int]:
        return list(range(job.active - 1))

    def inject(self, target: Target, spec: FaultSpec) -> None:
        target.start_agent(spec.host)


class AddNode(LateSpare):
    kind = "add-node"
    summary = "a node added mid-job while the job is below its MAX (the group grows)"

    @classmethod
    def applies(cls, job: JobSpec) -> bool:
        return job.backend in DYNAMIC_BACKENDS and job.max_nodes > job.min_nodes

    @classmethod
    def victim_hosts(cls, job: JobSpec) -> Sequence[int]:
        return [job.max_nodes - 1]

    @classmethod
    def initial_hosts(cls, job: JobSpec) -> list[int]:
        return list(range(job.max_nodes - 1))


class HealthFails(Fault):
    kind = "health-fails"
    summary = "a host's health check fails at the next round (forced by killing one of its workers)"
    needs_launcher = True
    fails_rank = False

    @classmethod
    def applies(cls, job: JobSpec) -> bool:
        return job.backend in DYNAMIC_BACKENDS

    def inject(self, target: Target, spec: FaultSpec) -> None:
        target.make_sick(spec.host)
        _signal(target.worker_pid(spec.host, spec.local_rank), signal.SIGKILL)


class LogDirFull(Fault):
    kind = "log-dir-full"
    summary = "the file system of a host's --log-dir fills up (a small tmpfs)"
    strikes_agent = False
    loses_node = False

    def inject(self, target: Target, spec: FaultSpec) -> None:
        target.fill_log_dir(spec.host)


class EtcdMemberKilled(Fault):
    """SIGKILL of one member of the job's 3-member etcd cluster (etcd jobs only).

    The victim is an etcd member (``spec.host`` is its index), not a node: no agent is struck and
    no node is lost, and the two members left keep the quorum, so the job must finish with every
    node exiting 0; the agents' etcd clients fail over to the members left.
    """

    kind = "etcd-member-killed"
    summary = "SIGKILL of one member of the job's 3-member etcd cluster (etcd jobs only; the quorum stays)"
    strikes_agent = False
    loses_node = False

    @classmethod
    def applies(cls, job: JobSpec) -> bool:
        return job.backend == "etcd"

    @classmethod
    def victim_hosts(cls, job: JobSpec) -> Sequence[int]:
        return range(ETCD_MEMBERS)

    def inject(self, target: Target, spec: FaultSpec) -> None:
        target.kill_etcd_member(spec.host)


class Double(Fault):
    """Two faults at once: the plan draws two :data:`launcher.testing.chaos.plan.COMBINABLE` kinds."""

    kind = "double"
    summary = "two faults at once, on two hosts"

    def inject(self, target: Target, spec: FaultSpec) -> None:
        raise TypeError("a double trial injects its two faults, not this one")


#: Every fault kind, by name.
CATALOGUE: dict[str, type[Fault]] = {
    cls.kind: cls
    for cls in (KillAgent, KillWorker, KillStoreAgent, TermAgent, StopWorker, PauseAgent, CutLink, Netem,
                LateSpare, AddNode, HealthFails, LogDirFull, EtcdMemberKilled, Double)
}


def survivable(job: JobSpec, faults: Sequence[FaultSpec]) -> bool:
    """Every fault of a trial leaves MIN nodes and the store (two node losses count twice; with
    ``--segment``, MIN nodes in whole segments of one leaf)."""
    lost = {f.host for f in faults if CATALOGUE[f.kind].loses_node}
    if any(CATALOGUE[f.kind].loses_store for f in faults) or 0 in lost:
        return False
    if lost and not (job.elastic and job.backend != "static" and job.active - len(lost) >= job.min_nodes):
        return False
    # With --segment only whole segments of one leaf train: the nodes left must make MIN in them.
    if lost and job.whole_segments(set(range(job.active)) - lost) < job.min_nodes:
        return False
    return all(CATALOGUE[f.kind].survivable(job, f) for f in faults)


def settle(seconds: float) -> None:
    """Sleep (a named step, so a runner's timing is read in one place)."""
    time.sleep(max(0.0, seconds))


def describe_catalogue() -> list[dict[str, Any]]:
    return [{"kind": k, "summary": c.summary, "launcher only": c.needs_launcher} for k, c in CATALOGUE.items()]
