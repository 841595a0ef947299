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

__all__ = ["announce_restart", "stop_failed"]


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
