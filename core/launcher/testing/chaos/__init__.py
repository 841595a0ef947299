"""A seeded, replayable chaos campaign for multi-node jobs (docs/chaos.md).

Trial ``n`` of seed ``s`` (:func:`plan_trial`) draws a job kind, one fault or two from the
:data:`CATALOGUE`, the victims and the moments; :func:`run_trial` carries it out on namespace hosts
the caller supplies and returns a :class:`TrialRecord`; :func:`check` returns the invariants'
violations, each naming the seed and trial to replay. Standard library only at import (the
training job, ``job.py``, imports torch but runs in the workers only)::

    from launcher.testing.chaos import plan_campaign, run_trial, check

    for trial in plan_campaign(seed=7, trials=20):
        print(trial.describe())
        violations = check(run_trial(trial, my_network_factory, workdir / str(trial.index)))

``plan_campaign(..., backends=("etcd",))`` draws etcd jobs instead (the launcher-etcd plugin over a
real 3-member etcd cluster, :mod:`launcher.testing.chaos.etcd`) and the ``etcd-member-killed`` fault.
"""

from __future__ import annotations

from launcher.testing.chaos.etcd import EtcdCluster, find_etcd
from launcher.testing.chaos.faults import CATALOGUE, Fault, Target, survivable
from launcher.testing.chaos.invariants import INVARIANTS, AgentRecord, Injected, TrialRecord, check, report
from launcher.testing.chaos.plan import (
    BACKENDS,
    DEFAULT_BACKENDS,
    FaultSpec,
    JobSpec,
    Sizes,
    Trial,
    expected_digest,
    plan_campaign,
    plan_trial,
)
from launcher.testing.chaos.runner import JOB, HostLike, TrialRun, run_trial

__all__ = [
    "BACKENDS",
    "CATALOGUE",
    "DEFAULT_BACKENDS",
    "INVARIANTS",
    "JOB",
    "AgentRecord",
    "EtcdCluster",
    "Fault",
    "FaultSpec",
    "HostLike",
    "Injected",
    "JobSpec",
    "Sizes",
    "Target",
    "Trial",
    "TrialRecord",
    "TrialRun",
    "check",
    "expected_digest",
    "find_etcd",
    "report",
    "plan_campaign",
    "plan_trial",
    "run_trial",
    "survivable",
]
