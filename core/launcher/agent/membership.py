"""What the agent asks the rendezvous while its workers run: did nodes join, leave, or end the job?"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.agent.finished import FinishedNode, claim_reform, finished_nodes, no_reform_note, withdraw_claim
from launcher.agent.result import WatchOutcome
from launcher.rendezvous.api import STORE_FAILURES, RendezvousClosedError

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.reporting import NodeReporter
    from launcher.agent.result import AgentResult
    from launcher.containment.watchdog import Watchdog
    from launcher.failures.oom import OomWatch
    from launcher.failures.report import RankState, WorkerFailure
    from launcher.hangs.report import HangReport
    from launcher.plan import LaunchPlan
    from launcher.rendezvous.api import RendezvousHandler, RendezvousInfo

__all__ = [
    "arm_death_notice",
    "await_lost_nodes",
    "named",
    "cannot_reform",
    "heartbeat_timeout",
    "lost_since",
    "membership_changed",
    "reform_blocked",
    "restart_closed",
]

log = logging.getLogger("launcher.agent")


def membership_changed(handler: RendezvousHandler, reporter: NodeReporter,
                       emit: Callable[..., None], info: RendezvousInfo | None = None) -> WatchOutcome | None:
    """``CLOSED``, ``STORE_GONE`` or ``MEMBERSHIP`` when the rendezvous says so, else None.

    A store that is gone (a fresh connect fails) is noted on ``reporter``; one that only did
    not answer this time is logged and asked again at the next check. Once a node of ``info``'s
    round has finished, the round cannot re-form (:mod:`launcher.agent.finished`): a node that
    finished and then vanished is no loss, and joining nodes are not let in; a lost node that had
    not finished still returns ``MEMBERSHIP`` (the agent then ends the job, naming it).
    """
    try:
        if handler.is_closed():
            return WatchOutcome.CLOSED
        waiting = handler.num_nodes_waiting()
        lost = handler.lost_nodes()
    except STORE_FAILURES as exc:
        if reporter.note_store_gone(handler):
            return WatchOutcome.STORE_GONE
        log.warning("cannot reach the rendezvous store: %s", exc)
        return None
    if (lost or waiting > 0) and info is not None:
        finished = finished_nodes(info, reporter.plan.run_id)
        gone = {n.node_id for n in finished} & set(lost)
        if gone - reporter.gone_after_finishing:
            log.info("node(s) %s finished, then left or were lost: their work is done",
                     ", ".join(sorted(gone - reporter.gone_after_finishing)))
            reporter.gone_after_finishing |= gone
        lost = [node for node in lost if node not in gone]
        if finished:
            waiting = 0  # the round cannot re-form for them: a finished node joins no other round
    if lost and _still_suspected(handler, reporter, lost):
        return None
    if lost:
        reporter.lost = list(lost)
        log.warning("%s; re-forming the group", _gone(handler, lost))
        emit("membership_changed", lost=list(lost), waiting=waiting)
        return WatchOutcome.MEMBERSHIP
    if waiting > 0:
        reporter.lost = []
        log.info("%d node(s) waiting to join; re-forming the group", waiting)
        emit("membership_changed", lost=[], waiting=waiting)
        return WatchOutcome.MEMBERSHIP
    return None


#: The most seconds the workers run on beside a node lost by heartbeat silence alone.
SUSPECT_GRACE_MAX = 30.0
#: The grace where the rendezvous' heartbeat timeout is not known (``--rdzv-conf`` did not say).
SUSPECT_GRACE_DEFAULT = 10.0


def _still_suspected(handler: RendezvousHandler, reporter: NodeReporter, lost: list[str]) -> bool:
    """Whether every node of ``lost`` was reported for heartbeat silence alone, less than the
    grace ago: this node's workers then run on (the caller re-forms nothing yet).

    Silence is the weakest evidence: an agent that is paused (SIGSTOP, a frozen VM, a swap storm)
    stops beating while its host still answers (a dead or cut-off host is confirmed by the store
    within about the heartbeat timeout, and a firmer report replaces this one) and while its
    workers train on. Stopping healthy workers at once for it turned a job finishing at that
    moment into a failure on every node (the chaos campaign, pause-agent). During the grace the
    workers themselves decide: they finish (the exit barrier waits for a silent node), fail, or
    hang; past it, the group re-forms as for any lost node."""
    from launcher.rendezvous.departures import HEARTBEAT_TIMEOUT

    reasons = getattr(handler, "departures", None)
    try:
        why = reasons() if callable(reasons) else {}
    except Exception:  # a third-party handler's bug: act on the loss as before
        return False
    if not isinstance(why, dict) or any(why.get(node) != HEARTBEAT_TIMEOUT for node in lost):
        return False
    grace = min(SUSPECT_GRACE_MAX, heartbeat_timeout(reporter.plan) or SUSPECT_GRACE_DEFAULT)
    now = time.monotonic()
    new = [node for node in lost if node not in reporter.suspected]
    for node in new:
        reporter.suspected[node] = now
    if now - min(reporter.suspected[node] for node in lost) >= grace:
        return False
    if new:
        log.warning("node(s) %s sent no heartbeat within the heartbeat timeout, but nothing shows them gone "
                    "(a paused agent's host still answers): the workers here run on for up to %.0f s before "
                    "the group re-forms without them", ", ".join(sorted(new)), grace)
    return True


def reform_blocked(info: RendezvousInfo, handler: RendezvousHandler, reporter: NodeReporter, run_id: str,
                   failures: list[WorkerFailure]) -> list[FinishedNode]:
    """Before leaving ``info``'s round for another: the nodes of the round that had finished
    (non-empty: the new round cannot form; the caller ends the job). This node's failure is
    shared first, so that a node finishing at this very moment, which sees the claim, names it."""
    if info.group_world_size == 1:
        return []
    if failures:
        from launcher.failures.report import FailureReport

        root = FailureReport.from_failures(failures).root_cause.to_dict()
        reporter.publish(info, handler, reporter.outcome(info, root=root))
    return claim_reform(info, run_id)


def cannot_reform(info: RendezvousInfo, handler: RendezvousHandler, reporter: NodeReporter,
                  finished: list[FinishedNode], failures: list[WorkerFailure], ranks: list[RankState],
                  emit: Callable[..., None], *, what: str | None, hang: HangReport | None = None,
                  oom_watch: OomWatch | None = None) -> AgentResult:
    """End the job for every node, because ``finished`` nodes will join no other round: with
    this node's failures as the root cause, or the lost nodes that made it re-form. ``what``
    would have been tried (``a restart``), for the note that says why it was not; ``None``
    when nothing would have been (no restart left): then no note."""
    notes = [no_reform_note(finished, what)] if what else []
    for note in notes:
        log.error("%s", note)
    reason = None
    if not failures and reporter.lost:
        reason = f"lost contact with {named(handler, reporter.lost)} before it finished"
    elif not failures:
        reason = "its workers were stopped to re-form the group for a joining node"
    result = reporter.job_failed(info, handler, failures, ranks, closer=True, hang=hang, oom_watch=oom_watch,
                                 reason=reason, notes=notes)
    emit("job_failed", reason=result.message or "worker failure", failures=len(failures))
    return result


def restart_closed(reporter: NodeReporter, handler: RendezvousHandler, info: RendezvousInfo,
                   failures: list[WorkerFailure], ranks: list[RankState], exc: Exception,
                   emit: Callable[..., None], run_id: str, oom_watch: OomWatch | None) -> AgentResult:
    """This node's rendezvous for a restart failed after its workers failed in ``info``'s round:
    closed by a node that had finished meanwhile (see :mod:`launcher.agent.finished`), or its
    store shut down right after. The failure that led here is the job's story: report it."""
    why = "the job was closed by another node" if isinstance(exc, RendezvousClosedError) else str(exc)
    result = reporter.job_failed(info, handler, failures, ranks, closer=False, oom_watch=oom_watch,
                                 notes=[f"the restart did not happen: {why}"])
    withdraw_claim(info, run_id)  # the node that closed the job may stop serving the store now
    emit("job_failed", reason="worker failure", failures=len(failures))
    return result


def await_lost_nodes(handler: RendezvousHandler, plan: LaunchPlan, emit: Callable[..., None],
                     info: RendezvousInfo | None = None, grace: float | None = None) -> bool:
    """After a worker failure: was a lost node the cause?

    A node that dies breaks its peers' collectives at once, but its heartbeats take up to
    the heartbeat timeout to be missed; with no restart left, wait that long (``grace``, by
    default the heartbeat timeout) for the verdict. ``grace=0`` only reads whether some node
    has already been found lost (by whichever node watches it). Not when a node of ``info``'s
    round has already finished (it waits at the exit barrier, and will join no other round):
    then this node's own failure is the story, and it reports it.
    """
    if info is not None and finished_nodes(info, plan.run_id):
        return False
    if grace is None:
        grace = heartbeat_timeout(plan)
    deadline = time.monotonic() + grace
    while True:
        try:
            lost = handler.lost_nodes()
        except STORE_FAILURES:
            return False
        if lost:
            log.warning("%s; re-forming the group", _gone(handler, lost))
            emit("membership_changed", lost=list(lost), waiting=0)
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


def regrouping_for_joiners(handler: RendezvousHandler, emit: Callable[..., None]) -> bool:
    """After a worker failure on a multi-node job: is the group re-forming for a joining node?

    The node that first sees a node waiting to join stops its workers at once; its peers'
    collectives then break before those peers poll the rendezvous, so their workers fail. That
    failure is the re-forming, not the job's: such a node re-forms too, without counting a restart.
    """
    try:
        waiting = handler.num_nodes_waiting()
    except STORE_FAILURES:
        return False
    if waiting > 0:
        log.warning("workers failed while %d node(s) are waiting to join (the group is re-forming); re-forming too, "
                    "without counting a restart", waiting)
        emit("membership_changed", lost=[], waiting=waiting)
        return True
    return False


def arm_death_notice(handler: RendezvousHandler, watchdog: Watchdog) -> None:
    """Give the watchdog the rendezvous' death notice for this round (see
    :meth:`~launcher.rendezvous.dynamic.DynamicRendezvousHandler.death_notice`): if this agent
    dies, the others learn it at once rather than a heartbeat timeout later. After the workers
    started: nothing here delays them."""
    notice = getattr(handler, "death_notice", None)
    try:
        watchdog.death_notice(notice() if callable(notice) else None)
    except Exception as exc:  # a courtesy to the other nodes: never a reason to fail this one
        log.warning("no death notice for this round: %s", exc)


def named(handler: RendezvousHandler, nodes: list[str] | set[str]) -> str:
    """``node (why), ...``: departed nodes with the reason their report gave (``agent process
    died``, ``heartbeat timeout``), where the rendezvous keeps one (launcher's own does)."""
    from launcher.rendezvous.departures import describe

    reasons = getattr(handler, "departures", None)
    try:
        why = reasons() if callable(reasons) else {}
    except Exception:  # a third-party handler's bug must not hide which node left
        why = {}
    return describe(sorted(nodes), why if isinstance(why, dict) else {})


def _gone(handler: RendezvousHandler, nodes: list[str]) -> str:
    """``lost contact with node(s) ...``, or ``node(s) ... put out of the job`` when every one of
    them was put out on purpose (a straggler, launcher.stragglers.exclusion)."""
    from launcher.rendezvous.departures import STRAGGLER

    text = named(handler, nodes)
    reasons = getattr(handler, "departures", None)
    try:
        why = reasons() if callable(reasons) else {}
    except Exception:
        why = {}
    if nodes and isinstance(why, dict) and all(str(why.get(node, "")).startswith(STRAGGLER) for node in nodes):
        return f"node(s) {text} put out of the job"
    return f"lost contact with node(s) {text}"


def lost_since(previous: RendezvousInfo, current: RendezvousInfo) -> tuple[list[str], int]:
    """Participants of ``previous`` that are not in ``current``: their names, sorted, and how
    many more left unnamed (none and 0 when either list is unknown).

    When ``current`` follows ``previous`` at once and its backend names who left (the core's
    rendezvous does: O(1) bytes a node), that is the answer; otherwise both participant lists
    are compared (the core's rendezvous then reads both from the store: O(N) bytes each)."""
    if current.left is not None and current.round == previous.round + 1:
        names = sorted(current.left)
        return names, max(0, current.left_count - len(names))
    if not previous.participants or not current.participants:
        return [], 0
    try:
        return sorted(set(previous.participants) - set(current.participants)), 0
    except STORE_FAILURES:
        return [], 0


def heartbeat_timeout(plan: LaunchPlan) -> float:
    """How long a lost node may go unnoticed: ``--rdzv-conf heartbeat_timeout``, at most a minute."""
    value = plan.rendezvous.setting("heartbeat_timeout") or 0
    try:
        return min(60.0, max(0.0, float(value)))
    except (TypeError, ValueError):
        return 0.0
