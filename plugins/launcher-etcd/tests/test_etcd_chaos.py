"""The chaos campaign over etcd, run as a third-party backend runs it: seeded trials, 0 violations.

Through the public ``launcher.testing.chaos`` API only (docs/chaos.md): etcd jobs (``backends=("etcd",)``)
on namespace hosts, each job's agents rendezvous through this plugin on a real 3-member etcd cluster
in three more hosts, one fault a trial at a random moment, the six invariants checked after each.
A failure prints every violation with its seed and trial, replayed with
``python benchmarks/chaos.py --light --backend etcd --seed SEED --trial N --keep /tmp/trial``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from launcher.testing.chaos import Sizes, plan_campaign, report, run_trial

from tests.multinode.netns import Network, cleanup_stale, unavailable_reason

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the chaos job's workers need torch"),
]

#: Seed 6's first two light etcd trials: kill-agent and etcd-member-killed on an elastic job with a
#: spare (the next two, log-dir-full and cut-link, are left to benchmarks/chaos.py: CI's time).
SEED = 6
TRIALS = 2


def campaign() -> list:
    return plan_campaign(SEED, TRIALS, sizes=Sizes.light(), backends=("etcd",))


def test_the_campaign_kills_an_etcd_member_and_runs_only_etcd_jobs():
    trials = campaign()
    assert all(t.job.backend == "etcd" and t.job.etcd_members == 3 for t in trials)
    assert any(f.kind == "etcd-member-killed" for t in trials for f in t.faults)
    assert len({t.fault_kind for t in trials}) == TRIALS


@pytest.mark.timeout(600)
def test_a_seeded_etcd_campaign_breaks_no_invariant(etcd_binary: str, installed_plugin: Path, tmp_path: Path):
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    cleanup_stale()
    # The agents find the plugin (its entry point) on their PYTHONPATH, as an installed plugin.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(installed_plugin),
                                                                      os.environ.get("PYTHONPATH")]))}
    violations: list[str] = []
    for trial in campaign():
        record = run_trial(trial, Network, tmp_path / f"trial-{trial.index}", env=env, etcd_binary=etcd_binary)
        violations += report(record)
    assert not violations, "\n".join(violations)
