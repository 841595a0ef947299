"""The seeded plan of a chaos campaign: which job, which faults, which victims, which moments.

Trial ``n`` of seed ``s`` draws everything from ``random.Random(f"{s}:{n}")`` (string seeds are
hashed with SHA-512, so a plan is the same on every machine and Python version): one trial is
replayed alone from its seed and number, and a campaign of N trials is trials 0..N-1. Nothing
here starts a process; :mod:`launcher.testing.chaos.runner` carries a :class:`Trial` out.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.testing.chaos.faults import CATALOGUE
from launcher.testing.chaos.specs import (
    ALL_JOB_KINDS,
    BACKEND_OF,
    BACKENDS,
    DEFAULT_BACKENDS,
    JOB_KINDS,
    LAUNCHER_ONLY_JOB_KINDS,
    SEGMENT,
    SEGMENT_LEAVES,
    FaultSpec,
    JobSpec,
    Sizes,
    job_backends,
)

__all__ = ["ALL_JOB_KINDS", "BACKENDS", "BACKEND_OF", "DEFAULT_BACKENDS", "JOB_KINDS", "FaultSpec", "JobSpec", "Sizes",
           "Trial"]


@dataclass(frozen=True)
class Trial:
    """One trial: printed with :meth:`describe`, replayed with ``--seed SEED --trial INDEX``."""

    seed: int
    index: int
    job: JobSpec
    faults: tuple[FaultSpec, ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return f"seed {self.seed} trial {self.index}"

    @property
    def fault_kind(self) -> str:
        """The kind counted in a campaign's figures (``double`` for two faults at once)."""
        return self.faults[0].kind if len(self.faults) == 1 else "double"

    def describe(self) -> str:
        faults = "; ".join(
            (f"{f.kind} of etcd member m{f.host}" if f.kind in MEMBER_FAULTS else f"{f.kind} on h{f.host}")
            + (f" local rank {f.local_rank}" if f.kind in WORKER_FAULTS else "")
            + f" after step {f.after_step} + {f.delay:.2f} s" + (f" for {f.duration:g} s" if f.duration else "")
            for f in self.faults
        )
        job = self.job
        segment = f" --segment {job.segment}" if job.segment else ""
        return (f"{self.name}: {job.kind} ({job.backend}, --nnodes {job.nnodes}{segment}, "
                f"{job.active} of {job.hosts} hosts, {job.nproc} ranks a node, {job.steps} steps): {faults}"
                f"  [replay: --seed {self.seed} --trial {self.index}]")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: Fault kinds that hit one worker (their victim is a rank).
WORKER_FAULTS = frozenset({"kill-worker", "stop-worker"})
#: Fault kinds whose victim is an etcd member (``FaultSpec.host`` is the member's index).
MEMBER_FAULTS = frozenset({"etcd-member-killed"})
#: Fault kinds that may come two at once (``double``): each heals by itself or is harmless to combine.
COMBINABLE = ("kill-worker", "kill-agent", "term-agent", "pause-agent", "cut-link", "netem", "stop-worker")


def expected_digest(steps: int) -> str:
    """The result digest of an uninterrupted run of ``steps`` steps (the job's own rule)."""
    value = 0.0
    for step in range(steps):
        value = round(value * 0.5 + step + 1, 6)
    return hashlib.sha256(f"{steps}:{value:.6f}".encode()).hexdigest()[:16]


def job_for(kind: str, sizes: Sizes, backend: str | None = None) -> JobSpec:
    """The job of ``kind`` at ``sizes`` on ``backend`` (default: the kind's own, :data:`BACKEND_OF`):
    an elastic job keeps its last host as a spare. A ``segments`` job has :data:`SEGMENT_LEAVES`
    leaves of :data:`SEGMENT` hosts at any sizes (``--nnodes SEGMENT --segment SEGMENT``: one
    leaf's segment trains, the other hosts wait as spares). An etcd job's members are hosts of
    their own, not counted in ``hosts``."""
    common: dict[str, Any] = dict(kind=kind, backend=backend or BACKEND_OF[kind], hosts=sizes.hosts, nproc=sizes.nproc,
                                  steps=sizes.steps, step_seconds=sizes.step_seconds)
    if kind == "elastic-spare":
        top = max(2, sizes.hosts - 1)
        return JobSpec(**common, active=sizes.hosts, min_nodes=2, max_nodes=top)
    if kind == "segments":
        hosts = SEGMENT * SEGMENT_LEAVES
        return JobSpec(**{**common, "hosts": hosts}, active=hosts, min_nodes=SEGMENT, max_nodes=SEGMENT)
    fixed = max(2, sizes.hosts - 1)
    return JobSpec(**{**common, "hosts": fixed}, active=fixed, min_nodes=fixed, max_nodes=fixed,
                   preload=kind == "preload", recoverable=kind == "recoverable")


def applicable(kind: str, job: JobSpec, tool: str = "launcher") -> bool:
    """Whether fault ``kind`` means something for ``job`` under ``tool`` (``launcher`` or ``torchrun``)."""
    fault = CATALOGUE[kind]
    # torchrun's etcd backends are not part of the comparison (they speak etcd's v2 API).
    if tool == "torchrun" and (fault.needs_launcher or job.preload or job.recoverable or job.segment
                               or job.backend == "etcd"):
        return False
    return fault.applies(job)


def plan_trial(seed: int, index: int, *, sizes: Sizes | None = None, tool: str = "launcher",
               kinds: tuple[str, ...] | None = None, skip: frozenset[str] = frozenset(),
               job_kinds: tuple[str, ...] = JOB_KINDS, backends: tuple[str, ...] = DEFAULT_BACKENDS) -> Trial:
    """Trial ``index`` of the campaign of ``seed``: the same arguments give the same trial.

    ``kinds`` limits the fault kinds drawn (default: the whole catalogue), ``skip`` leaves some out
    (the CI campaign's known bugs), ``job_kinds`` limits the jobs (or asks for kinds of
    :data:`ALL_JOB_KINDS` not drawn by default, such as ``segments``). ``backends`` (some of
    :data:`BACKENDS`) are the rendezvous backends drawn: c10d and static by default; with ``etcd``
    the c10d job kinds run over a 3-member etcd cluster and ``etcd-member-killed`` can be drawn
    (``("etcd",)``: etcd jobs only). torchrun gets no etcd job. A job kind none of whose faults
    applies is drawn again.
    """
    sizes = sizes or Sizes()
    rng = random.Random(f"{seed}:{index}")
    pool = [k for k in (kinds or tuple(CATALOGUE)) if k not in skip]
    jobs = [(k, b) for k, b in job_backends(job_kinds, backends)
            if not (tool == "torchrun" and (k in LAUNCHER_ONLY_JOB_KINDS or b == "etcd"))]
    if not jobs:
        raise ValueError(f"no job kind of {', '.join(job_kinds)} runs on {', '.join(backends)} under {tool}")
    for _ in range(100):
        kind_of_job, backend = rng.choice(jobs)
        job = job_for(kind_of_job, sizes, backend)
        choices = [k for k in pool if k != "double" and applicable(k, job, tool)]
        if "double" in pool:
            pair = [k for k in COMBINABLE if k in choices]
            if len(pair) >= 2:
                choices.append("double")
        if choices:
            break
    else:
        raise ValueError(f"no fault of {pool} applies to any job kind")
    kind = rng.choice(choices)
    after = rng.randint(1, max(1, job.steps // 3))
    if kind == "double":
        first, second = rng.sample([k for k in COMBINABLE if k in choices], 2)
        hosts = rng.sample(range(1, job.active), 2) if job.active > 2 else [1, 1]
        faults = tuple(CATALOGUE[k].plan(rng, job, after, host=h) for k, h in ((first, hosts[0]), (second, hosts[1])))
    else:
        faults = (CATALOGUE[kind].plan(rng, job, after),)
    return Trial(seed=seed, index=index, job=job, faults=faults)


def plan_campaign(seed: int, trials: int, **options: Any) -> list[Trial]:
    """Trials 0..``trials``-1 of ``seed`` (see :func:`plan_trial` for ``options``)."""
    return [plan_trial(seed, n, **options) for n in range(trials)]


def dumps(trials: list[Trial]) -> str:
    """The plan as JSON (what a campaign's result file keeps, to replay a trial elsewhere)."""
    return json.dumps([t.to_json() for t in trials], indent=1)
