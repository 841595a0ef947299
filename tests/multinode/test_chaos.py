"""The CI chaos campaign (docs/chaos.md): seeded trials on namespace hosts, 0 violations of the invariants.

Each trial is one job (light: 3 hosts, 1 rank a node, 10 steps) and one fault, or two, at a random
moment after training started; after every trial the six invariants are checked. A failure prints
every violation with its seed and trial, replayed with
``python benchmarks/chaos.py --light --seed SEED --trial N --keep /tmp/trial``.

:data:`KNOWN_BUGS` is the one place where a fault kind (or a job kind, ``job:KIND``) that still
breaks an invariant because of a bug being fixed is left out of this campaign, naming the bug;
remove an entry when its fix lands.
"""

from __future__ import annotations

import pytest
from launcher.testing.chaos import Sizes, check, plan_trial, run_trial

from tests.multinode.netns import Network

pytestmark = [pytest.mark.netns, pytest.mark.slow]

SEED = 45
TRIALS = 8

#: The one place where the CI campaign leaves out what still breaks an invariant because of a bug
#: being fixed: a fault kind (``"late-spare"``), a job kind (``"job:recoverable"``) or one fault kind
#: in one job kind (``"recoverable/stop-worker"``), each naming its bug. Remove an entry when the fix lands.
KNOWN_BUGS: dict[str, str] = {}


def known_bug(trial) -> str | None:
    """The :data:`KNOWN_BUGS` entry ``trial`` would run into, if any."""
    keys = [f"job:{trial.job.kind}"]
    for fault in trial.faults:
        keys += [fault.kind, f"{trial.job.kind}/{fault.kind}"]
    return next((KNOWN_BUGS[k] for k in keys if k in KNOWN_BUGS), None)


def campaign() -> list:
    """The first :data:`TRIALS` trials of :data:`SEED` that run into no known bug (the same every run)."""
    trials = []
    for index in range(TRIALS * 20):
        trial = plan_trial(SEED, index, sizes=Sizes.light())
        if known_bug(trial) is None:
            trials.append(trial)
        if len(trials) == TRIALS:
            return trials
    raise AssertionError("KNOWN_BUGS leaves too few trials")


def test_the_known_bugs_leave_a_campaign_of_several_kinds():
    trials = campaign()
    assert len(trials) == TRIALS and len({t.fault_kind for t in trials}) >= 4


@pytest.mark.timeout(900)
def test_a_seeded_campaign_breaks_no_invariant(tmp_path):
    violations: list[str] = []
    for trial in campaign():
        record = run_trial(trial, Network, tmp_path / f"trial-{trial.index}")
        found = check(record)
        if found:
            violations.append(trial.describe())
            violations += [f"    {v}" for v in found]
            violations += [f"    h{a.host} exited {a.exit_code}; stderr tail:\n" + "\n".join(
                "      " + line for line in a.stderr.splitlines()[-8:]) for a in record.agents]
    assert not violations, "\n".join(violations)
