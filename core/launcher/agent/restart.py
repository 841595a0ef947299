"""A full restart after a failure: stopping the failed group, and saying that it restarts.

Moved out of :mod:`launcher.agent.agent`. The alternative, recovering in place with the live
workers kept, is :mod:`launcher.recovery.inplace`; the agent asks it first.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.failures.exits import describe_exit

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.group import WorkerGroup, WorkerSlot
    from launcher.agent.reporting import NodeReporter
    from launcher.failures.report import RankState, WorkerFailure
    from launcher.hangs.report import HangReport

log = logging.getLogger("launcher.agent")

__all__ = ["RestartTally", "announce_restart", "restarts_note", "stop_failed"]


class RestartTally:
    """The restarts this node used, by kind: in-place recoveries (the live workers kept their
    process, :mod:`launcher.recovery`) and full restarts (every worker started again). Each uses
    one of ``--max-restarts`` and advances ``TORCHELASTIC_RESTART_COUNT``."""

    def __init__(self) -> None:
        self.in_place = 0
        self.full = 0
        self._charged: list[bool] = []  # each charge's kind (True: in place), for refund()

    def charge(self, *, in_place: bool) -> None:
        """One more restart of that kind."""
        self._charged.append(in_place)
        if in_place:
            self.in_place += 1
        else:
            self.full += 1

    def refund(self) -> None:
        """Take back the last charge (a node left: re-forming costs no restart)."""
        if self._charged:
            if self._charged.pop():
                self.in_place -= 1
            else:
                self.full -= 1

    def summary(self) -> str:
        """``1 in-place recovery, 0 restarts``."""
        return (f"{self.in_place} in-place recover{'y' if self.in_place == 1 else 'ies'}, "
                f"{self.full} restart{'' if self.full == 1 else 's'}")


def stop_failed(group: WorkerGroup, failed: list[WorkerSlot] | None, shutdown_timeout: float,
                report: NodeReporter) -> tuple[list[WorkerFailure], list[RankState]]:
    """Stop the workers still running and close the group; the failures of ``failed`` (``None``:
    of the workers that had ended with an error before the stop) and every rank's state."""
    killed = {s.local_rank for s in group.running()}
    group.stop(signal.SIGTERM, shutdown_timeout)
    group.drain_output(group.slots)
    if failed is None:
        failed = [s for s in group.slots
                  if s.local_rank not in killed and s.process is not None and s.process.returncode]
    failures = report.failures(group, failed)
    ranks = report.rank_states(group, killed)
    group.close()
    return failures, ranks


def announce_restart(failures: list[WorkerFailure], hang: HangReport | None, count: int, left: int, total: int,
                     emit: Callable[..., Any], fallback: str | None = None) -> None:
    """One log line and a ``group_restarted`` event: the group restarts after ``failures`` (or ``hang``);
    ``fallback``: why it is not an in-place recovery, when the workers used launcher.recoverable."""
    first = failures[0]
    ended = describe_exit(first.exitcode, first.signal)
    reason = f"local rank {first.local_rank} (pid {first.pid}) {ended}"
    if hang is not None:
        reason = f"{hang.reason} (detected by {hang.detected_by})"
    log.warning("worker group %s: %s; restarting (%d of %d restarts left)",
                "hung" if hang is not None else "failed", reason, left, total)
    extra = {"fallback": fallback} if fallback else {}
    emit("group_restarted", count=count, reason=reason, cause="hang" if hang is not None else "failure",
         mode="restart", **extra)


def restarts_note(tally: RestartTally, max_restarts: int) -> str | None:
    """The line that ends a job's report: ``restarts used: 1 in-place recovery, 0 restarts (of
    --max-restarts 2)``; ``None`` when the job could use none."""
    if max_restarts <= 0:
        return None
    return f"restarts used: {tally.summary()} (of --max-restarts {max_restarts})"
