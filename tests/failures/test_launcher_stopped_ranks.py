"""A rank the launcher itself stopped is never the root cause while a rank that hung or failed is
known (issue 45): not on this node, nor among the other nodes' roots read from the store."""

from __future__ import annotations

import signal

from launcher.agent.reporting import blame_order
from launcher.failures import FailureReport, WorkerFailure
from launcher.failures.report import ReportedFailure


def _failure(rank: int, when: float, *, sig: int | None = None, code: int | None = None,
             **flags: bool) -> WorkerFailure:
    return WorkerFailure(node=f"host{rank // 2}", rank=rank, local_rank=rank % 2, role="default", pid=1000 + rank,
                         exitcode=code, signal=sig, timestamp=when, group_rank=rank // 2, **flags)


def test_the_hung_rank_is_the_root_cause_though_a_rank_stopped_by_the_launcher_died_first():
    # Rank 3 died of the launcher's SIGTERM at once; rank 2, hung and stopped, was SIGKILLed after.
    stopped_peer = _failure(3, 100.0, sig=signal.SIGTERM, ended_by_launcher=True)
    hung = _failure(2, 100.5, sig=signal.SIGKILL, hung=True, stopped=True)
    report = FailureReport.from_failures([stopped_peer, hung])
    assert [entry.failure.rank for entry in report.failures] == [2, 3]
    why = report.root_cause.explanation() or ""
    assert why.startswith("hung:") and "state T" in why and "killed it at once" in why
    # Not stopped: the words say hung, and nothing of state T.
    assert "state T" not in (ReportedFailure(_failure(2, 1.0, sig=signal.SIGKILL, hung=True)).explanation() or "")


def test_a_rank_that_failed_on_its_own_comes_before_those_the_launcher_stopped():
    stopped_peer = _failure(1, 50.0, sig=signal.SIGTERM, ended_by_launcher=True)
    failed = _failure(0, 51.0, code=1)
    assert FailureReport.from_failures([stopped_peer, failed]).root_cause.failure.rank == 0
    # Only launcher-stopped ranks: the earliest of them, as before.
    later = _failure(2, 52.0, sig=signal.SIGTERM, ended_by_launcher=True)
    assert FailureReport.from_failures([later, stopped_peer]).root_cause.failure.rank == 1


def test_the_flags_survive_the_store_and_order_every_nodes_roots():
    # Each node shares its root through the store as JSON (launcher.agent.outcome): a node whose
    # ranks were all stopped by the launcher shares one of those; the hung rank's node its hung rank.
    shared = [
        ReportedFailure(_failure(0, 10.0, sig=signal.SIGTERM, ended_by_launcher=True)).to_dict(),
        ReportedFailure(_failure(2, 12.0, sig=signal.SIGKILL, hung=True, stopped=True)).to_dict(),
        ReportedFailure(_failure(4, 11.0, code=1)).to_dict(),
    ]
    roots = [ReportedFailure.from_dict(data) for data in shared]
    assert roots[1].failure.hung and roots[1].failure.stopped and roots[0].failure.ended_by_launcher
    # No hang report here (a restart that could not happen reports without one): the flags decide.
    assert [r.failure.rank for r in sorted(roots, key=lambda r: blame_order(r, []))] == [2, 4, 0]
    # The ranks a hang report blames still come first.
    assert [r.failure.rank for r in sorted(roots, key=lambda r: blame_order(r, [4]))] == [4, 2, 0]
    # A record written before these flags existed reads as a failure of its own.
    old = {k: v for k, v in shared[0].items() if k not in ("ended_by_launcher", "hung", "stopped")}
    assert ReportedFailure.from_dict(old).failure.blame_class == 1
