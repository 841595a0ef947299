"""What the agent calls: the checks before each round, and the other nodes' exclusions.

Before each round this node joins, the plan's checks run: :meth:`HealthGate.start` starts them
and returns, so that they run beside the agent's way to the rendezvous (for the first round, from
the moment the job's watchdog and containment are up: the handler is created, the store served or
reached, meanwhile), and :meth:`HealthGate.verdict` waits for their answer before the node joins
(:meth:`HealthGate.before_join` does both at once). A sick node leaves its record on the job's
:class:`~launcher.health.board.ExclusionBoard`, says one line and raises
:class:`~launcher.health.api.NodeSick` (exit status :data:`~launcher.health.api.EXIT_NODE_SICK`)
without joining. Healthy nodes :meth:`poll` the
board once their workers run and at every membership check, and :meth:`finish` reads it once
more when the job ends: each excluded node is logged and emitted (``node_excluded``) once, and
named again in the job's last lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.health.api import NodeSick

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.result import AgentResult
    from launcher.health.board import ExcludedNode, ExclusionBoard
    from launcher.health.runner import CheckOutcome, RunningChecks
    from launcher.plan import LaunchPlan

__all__ = ["HealthGate", "NodeSick"]

log = logging.getLogger("launcher.health")

_UNSET: Any = object()


class HealthGate:
    """The health checks of one agent (see the module docstring)."""

    def __init__(self, plan: LaunchPlan, emit: Callable[..., None]) -> None:
        self._plan = plan
        self._emit = emit
        self._board: ExclusionBoard | None = _UNSET
        #: Set when this node failed a check: it joined nothing, and must not close the job.
        self.excluded: NodeSick | None = None
        #: The last run's outcomes.
        self.last_outcomes: list[CheckOutcome] = []
        #: The job's watchdog token, which every process a check starts carries.
        self.job_token: str | None = None
        #: The checks started for the next round, not yet answered (:meth:`start`).
        self._running: RunningChecks | None = None

    def _board_of(self, handler: object) -> ExclusionBoard | None:
        if self._board is _UNSET:
            from launcher.health.board import board_of

            self._board = board_of(handler, self._plan.run_id)
        return self._board

    @property
    def kept_out(self) -> list[ExcludedNode] | None:
        """The nodes health checks kept out of the job, as this node's polls read them so far;
        ``None`` where the rendezvous lends no store (no board: nothing can be known)."""
        board = self._board
        return None if board is _UNSET or board is None else list(board.seen)

    def start(self) -> None:
        """Start the checks for the next round this node joins, and return at once (nothing when
        no check is to run, or when they are already running)."""
        health = self._plan.health
        if health is None or self._running is not None:
            return
        from launcher.health.runner import JOB_TOKEN, start_checks

        if self.job_token and self.job_token not in JOB_TOKEN:
            JOB_TOKEN.append(self.job_token)
        self._running = start_checks(health.checks, health.context)

    def verdict(self, handler: object) -> None:
        """Wait for the checks :meth:`start` started (starting them first if it was not called);
        raise :class:`NodeSick` (after leaving the record) when one failed. Each round's
        checks answer once: the next call starts them again."""
        health = self._plan.health
        if health is None:
            return
        self.start()
        running, self._running = self._running, None
        assert running is not None
        outcomes = running.outcomes()
        self.last_outcomes = outcomes
        for outcome in outcomes:
            log.debug("health check %r: %s%s (%.3f s)", outcome.name, outcome.result.status,
                      f": {outcome.result.reason}" if outcome.result.reason else "", outcome.seconds)
        failed = [o for o in outcomes if o.result.is_sick]
        if not failed:
            return
        first = failed[0]
        reason = "; ".join(f"{o.result.reason}" if o is first else f"{o.name}: {o.result.reason}" for o in failed)
        self.excluded = NodeSick(self._plan.node, first.name, reason)
        self._post(handler, first.name, reason)
        raise self.excluded

    def close(self) -> None:
        """The agent ends: checks still running are not waited for, and the processes they run
        are killed (a failure between :meth:`start` and :meth:`verdict` leaves none behind)."""
        if self._running is None:
            return
        self._running = None
        from launcher.health.runner import kill_check_processes

        kill_check_processes()

    def before_join(self, handler: object) -> None:
        """Run the checks and wait for them: :meth:`start`, then :meth:`verdict`."""
        self.start()
        self.verdict(handler)

    def _post(self, handler: object, check: str, reason: str) -> None:
        from launcher.health.board import ExcludedNode

        addr = None
        try:
            address = getattr(handler, "node_address", None)
            addr = address() if callable(address) else None
            board = self._board_of(handler)
            record = ExcludedNode(self._plan.node, addr, check, reason)
            if board is not None:
                board.post(record)
        except Exception as exc:  # the node stays out either way; the others then only miss the why
            log.warning("cannot leave the health record in the rendezvous store: %s", exc)
        self._emit("node_excluded", excluded_node=self._plan.node, addr=addr, check=check, reason=reason)

    def poll(self, handler: object) -> list[ExcludedNode]:
        """Log and emit the exclusions recorded since the last poll (one store read when none)."""
        try:
            board = self._board_of(handler)
            new = board.read_new() if board is not None else []
        except Exception as exc:  # a store problem is the membership check's to report
            log.debug("cannot read the health records: %s", exc)
            return []
        for record in new:
            log.warning("node %s was kept out of the job: health check %r failed: %s", record.label, record.check,
                        record.reason)
            self._emit("node_excluded", excluded_node=record.node, addr=record.addr, check=record.check,
                       reason=record.reason)
        return new

    def finish(self, handler: object, result: AgentResult | None = None, store_ok: bool = True) -> None:
        """At the job's end: read the board once more (not when the store is known to be gone:
        ``store_ok`` false), and name every excluded node again, in the log and as a note of
        ``result``'s failure report when there is one."""
        if self.excluded is not None or not store_ok or self._board is _UNSET and not _lends_store(handler):
            return
        self.poll(handler)
        board = self._board if self._board is not _UNSET else None
        if board is None or not board.seen:
            return
        line = (f"{len(board.seen)} node(s) were kept out of this job by health checks: "
                + "; ".join(record.describe() for record in board.seen))
        if result is not None and result.report is not None:
            result.report.notes.append(line)  # printed with the report
        else:
            log.warning("%s", line)


def _lends_store(handler: object) -> bool:
    from launcher.health.board import HealthBoardHandler

    return isinstance(handler, HealthBoardHandler)
