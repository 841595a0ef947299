"""The chaos harness without hosts: the seeded plan, the fault catalogue, each invariant on constructed records."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import subprocess
import sys

import pytest
from launcher.testing.chaos import CATALOGUE, Fault, Sizes, expected_digest, plan_campaign, plan_trial
from launcher.testing.chaos.faults import survivable
from launcher.testing.chaos.invariants import (
    INVARIANTS,
    AgentRecord,
    Injected,
    TrialRecord,
    check,
    clean_output,
    invariant_number,
    no_false_failure,
    no_hang,
    no_leftovers,
    root_cause_named,
    true_verdict,
)
from launcher.testing.chaos.plan import (
    ALL_JOB_KINDS,
    BACKEND_OF,
    BACKENDS,
    COMBINABLE,
    DEFAULT_BACKENDS,
    JOB_KINDS,
    FaultSpec,
    applicable,
    dumps,
    job_for,
)
from launcher.testing.chaos.specs import ETCD_MEMBERS, job_backends


def test_the_same_seed_gives_the_same_trials():
    assert plan_campaign(11, 30) == plan_campaign(11, 30)
    assert plan_campaign(11, 30, sizes=Sizes.light()) == plan_campaign(11, 30, sizes=Sizes.light())


def test_another_seed_gives_other_trials():
    assert plan_campaign(11, 30) != plan_campaign(12, 30)


def test_a_trial_replays_alone_as_it_ran_in_its_campaign():
    campaign = plan_campaign(5, 12)
    assert [plan_trial(5, n) for n in range(12)] == campaign
    assert "--seed 5 --trial 3" in campaign[3].describe()


def test_the_plan_is_the_same_in_a_fresh_interpreter():
    """String seeds are hashed with SHA-512: no PYTHONHASHSEED, machine or process changes a plan."""
    code = "from launcher.testing.chaos import plan_trial; print(plan_trial(3, 4).describe())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"})
    assert other.stdout.strip() == plan_trial(3, 4).describe()


def test_a_long_campaign_draws_every_runnable_fault_kind_and_job_kind():
    trials = plan_campaign(1, 400)
    kinds = {t.fault_kind for t in trials}
    assert kinds == set(CATALOGUE) - {"etcd-member-killed"}
    assert {t.job.kind for t in trials} == set(JOB_KINDS)


def test_skipped_kinds_are_never_drawn_and_torchrun_gets_no_launcher_option():
    skip = frozenset({"late-spare", "kill-worker"})
    assert not any(f.kind in skip for t in plan_campaign(2, 200, skip=skip) for f in t.faults)
    for trial in plan_campaign(2, 200, tool="torchrun"):
        assert not (trial.job.preload or trial.job.recoverable)
        assert not any(CATALOGUE[f.kind].needs_launcher for f in trial.faults)


def test_moments_are_after_training_started_and_victims_exist():
    for trial in plan_campaign(4, 300, sizes=Sizes.light()):
        for fault in trial.faults:
            assert fault.after_step >= 1 and 0 <= fault.delay <= 1
            assert 0 <= fault.host < trial.job.hosts
            assert 0 <= fault.local_rank < trial.job.nproc


@pytest.mark.parametrize("kind", sorted(CATALOGUE))
def test_each_fault_kind_is_well_formed(kind):
    cls = CATALOGUE[kind]
    assert issubclass(cls, Fault) and cls.kind == kind and cls.summary
    assert "inject" in {name for klass in cls.__mro__[:-2] for name in vars(klass)}
    if cls.lasts is not None:  # a fault that lasts is healed
        assert cls.heal is not Fault.heal and 0 < cls.lasts[0] <= cls.lasts[1]
    assert inspect.signature(cls.inject).parameters.keys() == {"self", "target", "spec"}
    jobs = [job_for(k, s, b) for k, b in job_backends(JOB_KINDS, BACKENDS) for s in (Sizes(), Sizes.light())]
    assert any(cls.applies(job) for job in jobs)


def test_the_catalogue_has_at_least_twelve_kinds_and_doubles_combine_healable_ones():
    assert len(CATALOGUE) >= 12
    assert set(COMBINABLE) <= set(CATALOGUE)


def test_survivable_follows_min_nodes_and_the_store():
    elastic = job_for("elastic-spare", Sizes())
    fixed = job_for("fixed", Sizes())
    spec = FaultSpec(kind="kill-agent", host=1)
    assert survivable(elastic, [spec]) and not survivable(fixed, [spec])
    assert not survivable(elastic, [FaultSpec(kind="kill-store-agent", host=0)])
    assert survivable(fixed, [FaultSpec(kind="kill-worker", host=1)])
    two = [spec, FaultSpec(kind="cut-link", host=2)]
    assert survivable(elastic, two)  # four nodes, MIN 2: two may go
    assert not survivable(job_for("elastic-spare", Sizes.light()), two)  # three nodes, MIN 2: one may go


def test_the_default_plan_draws_no_etcd_job_and_is_the_one_ci_runs():
    """Etcd jobs came later, drawn only when asked: the default plan (CI's seed 45) did not change."""
    assert job_backends(JOB_KINDS, DEFAULT_BACKENDS) == [(k, BACKEND_OF[k]) for k in JOB_KINDS]
    assert not any(t.job.backend == "etcd" for t in plan_campaign(1, 300))
    # Seed 45's light trials, as tests/multinode/test_chaos.py has run them since issue 45.
    light = hashlib.sha256(dumps(plan_campaign(45, 40, sizes=Sizes.light())).encode()).hexdigest()[:16]
    assert light == "55056c23389312bf"
    assert hashlib.sha256(dumps(plan_campaign(1, 40)).encode()).hexdigest()[:16] == "46c8e14ba6fb6fd3"


def test_an_etcd_campaign_runs_the_rendezvous_jobs_over_etcd_and_kills_members():
    trials = plan_campaign(1, 300, sizes=Sizes.light(), backends=("etcd",))
    assert {t.job.backend for t in trials} == {"etcd"} and all(t.job.etcd_members == ETCD_MEMBERS for t in trials)
    assert {t.job.kind for t in trials} == {k for k in JOB_KINDS if BACKEND_OF[k] == "c10d"}
    kinds = {t.fault_kind for t in trials}
    # No store agent on host 0 to kill over etcd; add-node needs MAX > MIN, which light jobs do not have.
    assert kinds == set(CATALOGUE) - {"kill-store-agent", "add-node"}
    members = [(t, f) for t in trials for f in t.faults if f.kind == "etcd-member-killed"]
    assert {f.host for _, f in members} == set(range(ETCD_MEMBERS))
    assert all(f"etcd-member-killed of etcd member m{f.host}" in t.describe() for t, f in members)
    mixed = plan_campaign(1, 300, backends=("c10d", "static", "etcd"))
    assert {t.job.backend for t in mixed} == set(BACKENDS)
    assert {t.job.kind for t in mixed if t.job.backend == "etcd"} == {k for k in JOB_KINDS if k != "static"}


def test_torchrun_gets_no_etcd_job_and_an_unknown_backend_is_refused():
    assert not any(t.job.backend == "etcd" for t in plan_campaign(2, 200, tool="torchrun", backends=BACKENDS))
    job = job_for("fixed", Sizes.light(), "etcd")
    assert not any(applicable(k, job, "torchrun") for k in CATALOGUE)
    with pytest.raises(ValueError, match="torchrun"):
        plan_trial(2, 0, tool="torchrun", backends=("etcd",))
    with pytest.raises(ValueError, match="unknown backend"):
        plan_trial(2, 0, backends=("zookeeper",))


def test_a_killed_etcd_member_strikes_no_agent_and_the_job_must_finish():
    fault = CATALOGUE["etcd-member-killed"]
    assert not (fault.strikes_agent or fault.loses_node or fault.loses_store or fault.fails_rank)
    spec = FaultSpec(kind="etcd-member-killed", host=2)
    for kind in ("fixed", "elastic-spare", "recoverable"):
        assert survivable(job_for(kind, Sizes.light(), "etcd"), [spec])
    assert not fault.applies(job_for("fixed", Sizes.light()))  # a c10d job has no etcd member
    trial = plan_trial(1, 0, kinds=("etcd-member-killed",), backends=("etcd",))
    agents = [AgentRecord(host=h, address=f"10.213.0.{h + 1}", exit_code=0, elapsed=10.0)
              for h in range(trial.job.active)]
    record = TrialRecord(trial=trial, tool="launcher", bound=100.0, agents=agents, finished=True,
                         injected=[Injected(kind="etcd-member-killed", host=trial.faults[0].host, at=5.0)],
                         digest=expected_digest(trial.job.steps), expected_digest=expected_digest(trial.job.steps),
                         must_finish=True)
    assert check(record) == []
    # The member's index is no host: the node of that number exiting non-zero is a false failure.
    struck = dataclasses.replace(agents[trial.faults[0].host % trial.job.active], exit_code=1)
    assert no_false_failure(dataclasses.replace(record, agents=[struck]))
    assert true_verdict(dataclasses.replace(record, finished=False, digest=None))


def test_the_uninterrupted_digest_is_the_jobs_rule():
    assert expected_digest(10) == expected_digest(10) != expected_digest(11)


def _record(**changes) -> TrialRecord:
    trial = plan_trial(1, 0, kinds=("kill-worker",))
    fault = trial.faults[0]
    clean = TrialRecord(
        trial=trial, tool="launcher", bound=100.0,
        agents=[AgentRecord(host=h, address=f"10.213.0.{h + 1}", exit_code=0, elapsed=10.0,
                            stdout=f"chaos step 0 rank {h} t 1.0\n") for h in range(trial.job.active)],
        injected=[Injected(kind="kill-worker", host=fault.host, at=5.0, pid=4242, rank=2)],
        finished=True, digest=expected_digest(trial.job.steps), expected_digest=expected_digest(trial.job.steps),
        must_finish=True, progress={h: [(1.0, f"chaos step 0 rank {h} t 1.0")] for h in range(trial.job.active)})
    return dataclasses.replace(clean, **changes)


def test_a_clean_record_breaks_no_invariant():
    assert check(_record()) == []


def _agent(record: TrialRecord, host: int, **changes) -> list[AgentRecord]:
    return [dataclasses.replace(a, **changes) if a.host == host else a for a in record.agents]


def test_each_invariant_flags_its_violation():
    base = _record()
    victim = base.injected[0].host
    cases = {
        no_hang: _record(agents=_agent(base, 0, exit_code=None, elapsed=130.0)),
        no_leftovers: _record(leftovers={1: ["777 python job.py"]}),
        true_verdict: _record(finished=False, digest=None),
        no_false_failure: _record(agents=_agent(base, victim, exit_code=1)),
        root_cause_named: _record(agents=_agent(base, 0, stderr=(
            "Root cause (first failure):\n  node       : h0 (node 0, 10.213.0.1)\n  rank       : 0 (local rank 0)\n"
            "  pid        : 99\n"))),
        clean_output: _record(agents=_agent(base, 0, stderr=(
            'Traceback (most recent call last):\n  File "/x/launcher/agent/agent.py", line 3, in run\n'))),
    }
    assert set(cases) == set(INVARIANTS)
    for invariant, record in cases.items():
        found = invariant(record)
        assert found, invariant.__name__
        assert all(record.trial.name in v for v in check(record))
        assert invariant_number(found[0]) == INVARIANTS.index(invariant) + 1


def test_the_root_cause_naming_the_victim_passes():
    report = ("Root cause (first failure):\n  node       : h1 (node 1, 10.213.0.{n})\n  rank       : 2 (local rank 0)\n"
              "  pid        : 4242\n")
    base = _record()
    victim = base.injected[0].host
    assert root_cause_named(_record(agents=_agent(base, 0, stderr=report.format(n=victim + 1)))) == []


def test_lost_output_and_false_success_are_flagged():
    base = _record()
    lost = dict(base.progress)
    lost[0] = [*lost[0], (2.0, "chaos step 1 rank 0 t 2.0")]
    assert clean_output(_record(progress=lost))
    assert true_verdict(_record(finished=False, digest=None, must_finish=False))  # exit 0 without finishing
    assert true_verdict(_record(digest="0000"))  # a wrong result
    # A worker's own traceback (prefixed by its agent) is not the launcher's.
    worker = 'Traceback (most recent call last):\n[default0]:  File "/x/launcher/recovery/worker.py", line 3\n'
    assert clean_output(_record(agents=_agent(base, 0, stderr=worker))) == []
    # A single worker's traceback is not prefixed: it has a frame of the job, through recoverable's.
    single = ('Traceback (most recent call last):\n  File "/x/launcher/recovery/worker.py", line 363, in _run\n'
              '  File "/x/launcher/testing/chaos/job.py", line 76, in train\nRuntimeError: closed\n')
    assert clean_output(_record(agents=_agent(base, 0, stderr=single))) == []
    # torchrun's own code counts as the tool's own.
    torchrun = 'Traceback (most recent call last):\n  File "/t/torch/distributed/elastic/agent/api.py", line 9\n'
    assert clean_output(_record(agents=_agent(base, 0, stderr=torchrun)))
    # One raised in torch that passed through launcher's @recoverable wrapper is the job's; one
    # raised inside launcher is ours.
    passed = ('Traceback (most recent call last):\n  File "/x/launcher/recovery/worker.py", line 363, in _run\n'
              '    result = fn()\n  File "/x/torch/distributed/distributed_c10d.py", line 3252, in all_reduce\n'
              '    work.wait()\nRuntimeError: Connection closed by peer\n')
    assert clean_output(_record(agents=_agent(base, 0, stderr=passed))) == []
    ours = ('Traceback (most recent call last):\n  File "/x/launcher/agent/agent.py", line 9, in run\n'
            '    boom()\nKeyError: 1\n')
    assert clean_output(_record(agents=_agent(base, 0, stderr=ours)))
    # An agent the fault struck may exit non-zero.
    killed = _record(injected=[Injected(kind="kill-agent", host=1, at=5.0)], agents=_agent(base, 1, exit_code=-9))
    assert no_false_failure(killed) == []


def test_a_segments_job_is_drawn_only_when_asked_two_leaves_of_two_hosts():
    """Issue 47's --segment job: not in the default plans (their digests above hold), asked by ``job_kinds``."""
    assert "segments" in ALL_JOB_KINDS and "segments" not in JOB_KINDS
    assert not any(t.job.kind == "segments" or t.job.segment for t in plan_campaign(1, 300))
    for sizes in (Sizes(), Sizes.light()):
        trials = plan_campaign(1207, 60, sizes=sizes, job_kinds=("segments",))
        assert {t.job.kind for t in trials} == {"segments"}
        job = trials[0].job
        assert (job.backend, job.hosts, job.active, job.nnodes, job.segment) == ("c10d", 4, 4, "2", 2)
        assert [job.domain(h) for h in range(4)] == ["spine0.leaf-a"] * 2 + ["spine0.leaf-b"] * 2
        assert "--nnodes 2 --segment 2" in trials[0].describe()
        kinds = {t.fault_kind for t in trials}
        assert "add-node" not in kinds and "etcd-member-killed" not in kinds  # MAX == MIN; no etcd
        assert {"late-spare", "kill-store-agent", "kill-agent"} <= kinds
        # A worker fault strikes the store's leaf, which trains first (a spare has no worker).
        assert {f.host for t in trials for f in t.faults if t.fault_kind in ("kill-worker", "stop-worker")} == {1}
    assert plan_trial(1207, 0, job_kinds=("segments",)) == plan_trial(1207, 0, job_kinds=("segments",))
    assert not any(applicable(k, job, "torchrun") for k in CATALOGUE)
    with pytest.raises(ValueError, match="torchrun"):
        plan_trial(1, 0, tool="torchrun", job_kinds=("segments",))


def test_a_segments_job_survives_only_what_leaves_a_whole_leaf():
    job = job_for("segments", Sizes.light())
    for host in (1, 2, 3):  # one node lost: a whole leaf is left (the store's or the other)
        assert survivable(job, [FaultSpec(kind="kill-agent", host=host)])
    assert survivable(job, [FaultSpec(kind="kill-agent", host=2), FaultSpec(kind="cut-link", host=3)])
    assert not survivable(job, [FaultSpec(kind="kill-agent", host=1), FaultSpec(kind="cut-link", host=2)])
    assert not survivable(job, [FaultSpec(kind="kill-agent", host=1), FaultSpec(kind="term-agent", host=3)])
    assert survivable(job, [FaultSpec(kind="kill-worker", host=1), FaultSpec(kind="netem", host=2)])
    assert job.whole_segments({0, 2, 3}) == 2 and job.whole_segments({0, 3}) == 0
    assert job_for("fixed", Sizes()).whole_segments(range(3)) == 3  # no --segment: every node counts


def test_a_segments_trial_writes_its_site_file_and_gives_the_agents_topology_and_segment(tmp_path):
    from launcher.testing.chaos.runner import TrialRun

    class Host:
        ifname = "veth0"

        def __init__(self, n):
            self.addr = f"10.213.0.{n + 1}"

        def endpoint(self, port):
            return f"{self.addr}:{port}"

    trial = plan_trial(1207, 1, sizes=Sizes.light(), job_kinds=("segments",))
    run = TrialRun(trial, [Host(n) for n in range(4)], tmp_path)
    assert (tmp_path / "topology.txt").read_text().splitlines() == [
        "10.213.0.1 spine0.leaf-a", "10.213.0.2 spine0.leaf-a", "10.213.0.3 spine0.leaf-b", "10.213.0.4 spine0.leaf-b"]
    args = run.agent_args(2)
    assert args[args.index("--topology") + 1] == f"file:{tmp_path / 'topology.txt'}"
    assert args[args.index("--segment") + 1] == "2" and args[args.index("--nnodes") + 1] == "2"
    plain = TrialRun(plan_trial(45, 0, sizes=Sizes.light()), [Host(n) for n in range(4)], tmp_path / "plain")
    assert "--topology" not in plain.agent_args(1) and "--segment" not in plain.agent_args(1)
