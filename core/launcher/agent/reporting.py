"""How a failed job is reported on this node: its failures, its ranks, and every node's outcome.

When a job fails, each agent describes its own workers (:meth:`NodeReporter.failures`,
:meth:`NodeReporter.rank_states`), shares its outcome with the other nodes through the
rendezvous store and reads theirs (:mod:`launcher.agent.outcome`), and reports the job's root
cause: the earliest failure of the whole job (:meth:`NodeReporter.job_failed`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from launcher.agent.result import AgentResult
from launcher.plugins.types import run_log_dir
from launcher.rendezvous.api import STORE_FAILURES, FixedMembership, StoreBackedHandler

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.group import WorkerGroup, WorkerSlot
    from launcher.agent.outcome import NodeOutcome
    from launcher.failures.oom import OomWatch
    from launcher.failures.report import FailureReport, RankState, WorkerFailure
    from launcher.hangs.report import HangReport
    from launcher.plan import CpuPlan, LaunchPlan
    from launcher.rendezvous.api import RendezvousHandler, RendezvousInfo

__all__ = ["NodeReporter", "blame_order", "started_workers", "store_gone"]

log = logging.getLogger("launcher.agent")


def store_gone(handler: RendezvousHandler) -> str | None:
    """One line when the rendezvous store is gone or cut off (a fresh connect fails), else None."""
    if not isinstance(handler, StoreBackedHandler):
        return None
    problem = handler.store_problem()
    if problem is None:
        return None
    return f"{handler.store_location()} is gone: {problem}"


def blame_order(entry: Any, blamed: Sequence[int] = ()) -> tuple[int, int, float, float, int]:
    """Sort key of failures, the root cause first: the ranks ``blamed`` for a hang in their order,
    then hung ranks, then ranks that failed on their own, then those the launcher stopped (each
    earliest first): a rank ended by the launcher's own SIGTERM or SIGKILL is a consequence."""
    rank = entry.failure.rank
    place = blamed.index(rank) if rank in blamed else len(blamed)
    return place, entry.failure.blame_class, entry.time, entry.failure.timestamp, rank


class NodeReporter:
    """This node's identity in a job and its side of reporting how the job ended."""

    def __init__(self, plan: LaunchPlan, emit: Callable[..., None]) -> None:
        self.plan = plan
        self.node = plan.node
        self._emit = emit
        #: This node's group rank and address in a multi-node job (None on a single node).
        self.group_rank: int | None = None
        self.node_addr: str | None = None
        #: Set when the rendezvous store stopped answering while workers ran (one line).
        self.store_note: str | None = None
        #: This node's ranks when the workers were last stopped to re-form the group.
        self.last_ranks: list[RankState] = []
        #: The nodes last found lost while the workers ran.
        self.lost: list[str] = []
        #: Nodes that finished and then vanished (already said; they are no loss).
        self.gone_after_finishing: set[str] = set()
        #: Nodes reported lost by heartbeat silence alone, and when this node first saw it
        #: (``time.monotonic()``): the workers here get a grace before they are stopped for them
        #: (:func:`launcher.agent.membership.membership_changed`).
        self.suspected: dict[str, float] = {}
        #: The hang this node is restarting after (set by the agent with its pending failures):
        #: the report of a restart that cannot happen names the hung rank, not the ranks stopped.
        self.pending_hang: HangReport | None = None

    def joined(self, info: RendezvousInfo, handler: RendezvousHandler) -> None:
        """Remember where this node stands in a multi-node round."""
        self.suspected.clear()  # a new round: its losses are judged afresh
        if info.group_world_size > 1:
            self.group_rank = info.group_rank
            announced = handler.node_address() if isinstance(handler, StoreBackedHandler) else None
            self.node_addr = self.plan.local_addr or announced

    def failures(self, group: WorkerGroup, failed: Sequence[WorkerSlot]) -> list[WorkerFailure]:
        """One record per failed worker (and a ``worker_failed`` event each), earliest first."""
        from launcher.failures.report import WorkerFailure

        failures = []
        for slot in failed:
            process = slot.process
            assert process is not None
            code = process.returncode
            failures.append(
                WorkerFailure(
                    node=self.node,
                    rank=slot.global_rank,
                    local_rank=slot.local_rank,
                    role=self.plan.role,
                    pid=process.pid,
                    exitcode=code if code is not None and code >= 0 else None,
                    signal=-code if code is not None and code < 0 else None,
                    timestamp=process.ended_at or time.time(),
                    error_file=slot.error_file,
                    stderr_tail=group.stderr_tail(slot),
                    group_rank=self.group_rank,
                    node_addr=self.node_addr,
                    code_finished=process.delivered,
                    ended_by_launcher=process.ended_by_launcher and not process.hung,
                    hung=process.hung,
                    stopped=process.was_stopped,
                )
            )
            self._emit(
                "worker_failed",
                rank=slot.global_rank,
                local_rank=slot.local_rank,
                pid=process.pid,
                exitcode=failures[-1].exitcode,
                signal=failures[-1].signal,
            )
        failures.sort(key=lambda f: f.timestamp)
        return failures

    def rank_states(self, group: WorkerGroup, killed: Collection[int]) -> list[RankState]:
        """Every local rank's state; ``killed`` are the local ranks the agent stopped."""
        from launcher.failures.report import RankState

        states = []
        for slot in group.slots:
            process = slot.process
            code = process.returncode if process is not None else None
            if process is None or code is None:
                state = "running"
            elif slot.local_rank in killed:
                state = "killed by the agent"
            else:
                state = "succeeded" if code == 0 else "failed"
            states.append(RankState(slot.global_rank, slot.local_rank, process.pid if process else None, state, code))
        return states

    def outcome(self, info: RendezvousInfo, root: dict[str, Any] | None = None,
                reason: str | None = None, notes: Sequence[str] = ()) -> NodeOutcome:
        """This node's record for the other nodes."""
        from launcher.agent.outcome import NodeOutcome

        return NodeOutcome(info.group_rank, self.node, self.node_addr, root, reason, list(notes))

    @property
    def label(self) -> str:
        """``host (node 1, 10.0.0.2)``: this node as reports name it (multi-node)."""
        return f"{self.node} (node {self.group_rank}{', ' + self.node_addr if self.node_addr else ''})"

    def note_store_gone(self, handler: RendezvousHandler | None) -> bool:
        """After a store call failed: whether the store is gone (a fresh connect fails); if so, the
        line saying so becomes :attr:`store_note` (nothing more is written to it)."""
        note = store_gone(handler) if handler is not None else None
        if note is not None:
            self.store_note = note
        return note is not None

    def _lost_store(self, handler: RendezvousHandler, exc: BaseException) -> None:
        self.store_note = store_gone(handler) or f"cannot reach the rendezvous store: {exc}"

    def publish(self, info: RendezvousInfo, handler: RendezvousHandler, outcome: NodeOutcome) -> None:
        """Share ``outcome`` with the other nodes of a multi-node round (a no-op otherwise)."""
        from launcher.agent.outcome import outcome_prefix, publish_outcome

        if info.store is None or info.group_world_size == 1 or self.store_note is not None:
            return
        try:
            publish_outcome(info.store, outcome_prefix(self.plan.run_id, info.round), outcome)
        except STORE_FAILURES as exc:
            self._lost_store(handler, exc)

    def gather(self, info: RendezvousInfo, handler: RendezvousHandler, *, closer: bool) -> dict[int, NodeOutcome]:
        """The other nodes' records: all of them (a closer, whose cause may not be the first), or
        until one names a cause (a node that only saw the job end)."""
        from launcher.agent.outcome import OUTCOME_TIMEOUT, collect_outcomes, outcome_prefix

        if info.store is None or info.group_world_size == 1 or self.store_note is not None:
            return {}

        def lost() -> set[int]:
            with contextlib.suppress(*STORE_FAILURES):
                names = set(handler.lost_nodes())
                if not names:  # nobody lost: no need to read the participants list (O(N) bytes)
                    return set()
                return {g for g, node in enumerate(info.participants) if node in names}
            return set()

        def enough(found: dict[int, NodeOutcome]) -> bool:
            if closer:
                return len(found) >= info.group_world_size
            return any(o.root or o.reason for g, o in found.items() if g != info.group_rank)

        # Nodes of a fixed-membership rendezvous (static) never learn that the job was closed,
        # so they write no record to wait for: read what is there.
        timeout = 0.0 if isinstance(handler, FixedMembership) else OUTCOME_TIMEOUT
        try:
            return collect_outcomes(info.store, outcome_prefix(self.plan.run_id, info.round),
                                    info.group_world_size, until=enough, lost=lost, timeout=timeout)
        except STORE_FAILURES as exc:
            self._lost_store(handler, exc)
            return {}

    def job_failed(self, info: RendezvousInfo, handler: RendezvousHandler, failures: list[WorkerFailure],
                   ranks: list[RankState], *, closer: bool, hang: HangReport | None = None,
                   oom_watch: OomWatch | None = None, reason: str | None = None,
                   notes: Sequence[str] = ()) -> AgentResult:
        """End a failed job on this node: share this node's outcome, close the rendezvous, learn
        the other nodes' outcomes, and report the job's root cause and every local rank.

        ``reason``: why this node ends the job when none of its workers failed (shared with the
        others, and this node's message when no node reports a failed worker). ``notes``: one-line
        facts for every node's report (shared too), such as why no restart was possible.
        """
        from launcher.failures.report import FailureReport, ReportedFailure

        if hang is None and self.pending_hang is not None and failures:
            hang = self.pending_hang  # a restart after this hang could not happen (launcher.agent.membership)
        local = FailureReport.from_failures(failures, oom_watch=oom_watch) if failures else None
        # After a hang every worker was stopped by the launcher: the root cause is the rank the
        # hang is blamed on (its flight record's evidence, else the likeliest hung rank), not the
        # first worker to die of the launcher's SIGTERM.
        blamed = hang.blamed_ranks if hang is not None else []
        if local is not None and blamed:
            local.failures.sort(key=lambda r: blame_order(r, blamed))
        if closer or local is not None or reason is not None:
            self.publish(info, handler, self.outcome(info, root=local.root_cause.to_dict() if local else None,
                                                     reason=reason, notes=notes))
        if closer:
            with contextlib.suppress(*STORE_FAILURES):
                handler.set_closed()
        others = self.gather(info, handler, closer=closer or local is not None)
        remote = [o for g, o in others.items() if g != info.group_rank]
        roots = [ReportedFailure.from_dict(o.root) for o in remote if o.root]
        entries = ([local.root_cause, *local.others] if local else []) + roots
        culprit = _hung_elsewhere(hang, blamed, entries, self.plan.role)
        if culprit is not None:
            entries.append(culprit)
        multi = info.group_world_size > 1
        this_node = f"{self.node} (node {info.group_rank}{', ' + self.node_addr if self.node_addr else ''})"
        shared = list(dict.fromkeys([*([reason] if reason else []), *notes, *(n for o in remote for n in o.notes)]))
        report_notes = [*([self.store_note] if self.store_note else []), *shared]
        if entries:
            entries.sort(key=lambda r: blame_order(r, blamed))
            root = entries[0]
            others_local = [e for e in entries[1:] if e in (local.failures if local else [])]
            if local is not None and root is local.root_cause:
                count = len(local.failures)
                title = f"{count} worker{'s' if count != 1 else ''} failed"
            else:
                title = f"the job failed on {root.failure.node_label}"
            report = FailureReport([root, *others_local], title=title, created=time.time(),
                                   node_ranks=ranks if multi else [], this_node=this_node if multi else "",
                                   notes=report_notes)
            if hang is not None:
                report.title = "a rank hung; the workers were stopped"
                report.hang = hang.to_dict()
            self.write_report(report)
            return AgentResult(exit_code=1, failures=failures, report=report)
        reasons = [f"{o.label}: {o.reason}" for o in remote if o.reason]
        if self.store_note:
            parts = [self.store_note]
        elif reasons:
            parts = ["the job was ended by " + "; ".join(reasons)]
        else:
            parts = []
        parts += [n for n in shared if not any(n in part for part in parts)]
        message = "; ".join(parts) or "the job was ended by another node (its workers failed, or it was stopped)"
        if multi and ranks:
            self.log_ranks(ranks)
        return AgentResult(exit_code=1, message=message)

    def log_ranks(self, ranks: list[RankState]) -> None:
        """This node's ranks and their states, ahead of the one-line error that ends the job."""
        from launcher.failures.report import render_ranks

        where = f"{self.node} (node {self.group_rank}{', ' + self.node_addr if self.node_addr else ''})"
        log.warning("%s", "\n".join(render_ranks(ranks, f"Ranks on this node ({where}):")))

    def write_report(self, report: FailureReport) -> None:
        """``failure_report.json`` in the job's log directory, when it has one."""
        logs_specs = self.plan.logs_specs
        with contextlib.suppress(Exception):
            # Ours names it run_log_dir; torch's DefaultLogsSpecs keeps it in _run_log_dir.
            log_dir = run_log_dir(logs_specs) or getattr(logs_specs, "_run_log_dir", None)
            if log_dir:
                report.write_json(os.path.join(log_dir, "failure_report.json"))


def _hung_elsewhere(hang: HangReport | None, blamed: Sequence[int], entries: Sequence[Any], role: str) -> Any:
    """The rank a hang is blamed on as a failure, when no node's record of it is at hand (its node
    re-formed without sharing one): every rank known here was only stopped by the launcher, and
    none of them is the root cause. Its node killed it at once (a blamed hung rank always is,
    :meth:`launcher.hangs.monitor.HangMonitor._doom`)."""
    if hang is None or not blamed or any(entry.failure.rank == blamed[0] for entry in entries):
        return None
    where = {id(entry): node for node in hang.nodes for entry in node.ranks}
    found = next((e for e in hang.entries if e.rank == blamed[0] and e.hung), None)
    if found is None or found.pid is None:
        return None
    import signal

    from launcher.failures.report import ReportedFailure, WorkerFailure

    node = where.get(id(found))
    return ReportedFailure(WorkerFailure(
        node=found.node, rank=found.rank, local_rank=found.local_rank, role=role, pid=found.pid, exitcode=None,
        signal=int(signal.SIGKILL), timestamp=time.time(), group_rank=node.group_rank if node else None,
        hung=True, stopped=found.stopped,
    ))


def started_workers(slots: Sequence[WorkerSlot], cpus: CpuPlan) -> list[dict[str, Any]]:
    """The ``workers`` field of the ``workers_started`` event: each worker's ranks, pid and CPUs."""
    from launcher.plan import format_cpus

    return [
        {
            "local_rank": s.local_rank,
            "rank": s.global_rank,
            "pid": s.process.pid if s.process else None,
            "cpus": format_cpus(cpus[s.local_rank]) if cpus and cpus[s.local_rank] else None,
        }
        for s in slots
    ]
