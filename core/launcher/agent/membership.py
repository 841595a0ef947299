"""What the agent asks the rendezvous while its workers run: did nodes join, leave, or end the job?"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.agent.barrier import finished_nodes
from launcher.agent.reporting import store_gone
from launcher.agent.result import WatchOutcome
from launcher.rendezvous.api import RendezvousError
from launcher.store.api import StoreError

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.reporting import NodeReporter
    from launcher.plan import LaunchPlan
    from launcher.rendezvous.api import RendezvousHandler, RendezvousInfo

__all__ = ["await_lost_nodes", "heartbeat_timeout", "lost_since", "membership_changed"]

log = logging.getLogger("launcher.agent")


def membership_changed(handler: RendezvousHandler, reporter: NodeReporter,
                       emit: Callable[..., None]) -> WatchOutcome | None:
    """``CLOSED``, ``STORE_GONE`` or ``MEMBERSHIP`` when the rendezvous says so, else None.

    A store that is gone (a fresh connect fails) is noted on ``reporter``; one that only did
    not answer this time is logged and asked again at the next check.
    """
    try:
        if handler.is_closed():
            return WatchOutcome.CLOSED
        waiting = handler.num_nodes_waiting()
        lost = handler.lost_nodes()
    except (StoreError, RendezvousError, OSError) as exc:
        note = store_gone(handler)
        if note is not None:
            reporter.store_note = note
            return WatchOutcome.STORE_GONE
        log.warning("cannot reach the rendezvous store: %s", exc)
        return None
    if lost:
        log.warning("lost contact with node(s) %s; re-forming the group", ", ".join(lost))
        emit("membership_changed", lost=list(lost), waiting=waiting)
        return WatchOutcome.MEMBERSHIP
    if waiting > 0:
        log.info("%d node(s) waiting to join; re-forming the group", waiting)
        emit("membership_changed", lost=[], waiting=waiting)
        return WatchOutcome.MEMBERSHIP
    return None


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
    if info is not None and finished_nodes(info, plan.run_id) > 0:
        return False
    if grace is None:
        grace = heartbeat_timeout(plan)
    deadline = time.monotonic() + grace
    while True:
        try:
            lost = handler.lost_nodes()
        except (StoreError, RendezvousError, OSError):
            return False
        if lost:
            log.warning("lost contact with node(s) %s; re-forming the group", ", ".join(lost))
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
    except (StoreError, RendezvousError, OSError):
        return False
    if waiting > 0:
        log.warning("workers failed while %d node(s) are waiting to join (the group is re-forming); re-forming too, "
                    "without counting a restart", waiting)
        emit("membership_changed", lost=[], waiting=waiting)
        return True
    return False


def lost_since(previous: RendezvousInfo, current: RendezvousInfo) -> set[str]:
    """Participants of ``previous`` that are not in ``current`` (empty when either is unknown)."""
    if not previous.participants or not current.participants:
        return set()
    return set(previous.participants) - set(current.participants)


def heartbeat_timeout(plan: LaunchPlan) -> float:
    """How long a lost node may go unnoticed: ``--rdzv-conf heartbeat_timeout``, at most a minute."""
    value = plan.rendezvous.setting("heartbeat_timeout") or 0
    try:
        return min(60.0, max(0.0, float(value)))
    except (TypeError, ValueError):
        return 0.0
