"""``--straggler-action exclude``: put a straggler's node out of the job, once, when the job can spare it.

Every node reaches the same verdict (:mod:`launcher.stragglers.verdict`) at the same interval. When
a verdict names ranks (held for two windows: the tracker's hysteresis), the monitor's thread
:meth:`Exclusion.propose` the node of the worst of them; the agent's main loop, at its next
membership check, calls :meth:`Exclusion.act`:

* exactly one node decides: the lowest group rank other than the straggler's node, i.e. group
  rank 0, or 1 when 0 is the straggler's (so only group rank 1 may need the round's roster to
  tell, and no two decide);
* it asks the rendezvous to put the node out (:meth:`DynamicRendezvousHandler.put_out
  <launcher.rendezvous.dynamic.DynamicRendezvousHandler.put_out>`), which publishes a departure
  with the reason ``straggler: rank 3 1.31x the median rank ...`` through the one re-forming path
  (:mod:`launcher.rendezvous.departures`) when a spare waits or the round has more than MIN nodes,
  and answers why not otherwise: then every node that sees why says so in one line, and the
  straggler is only reported.

Every node's membership check then sees the departure and re-forms. Before joining the next
round each agent calls :meth:`Exclusion.before_join`: the excluded node raises
:class:`NodeExcluded` (its workers are already stopped; exit status 69, as a sick node's: "this
node is bad, drain it"); the others say which node was put out and why, emit
``node_excluded`` (``check`` ``straggler``), and go on. A new round starts a new verdict from new measurements, so a
node is put out at most once per verdict, and never on the last round's numbers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from launcher.errors import LaunchError
from launcher.health.api import EXIT_NODE_SICK, NodeSick
from launcher.rendezvous.departures import STRAGGLER
from launcher.stragglers.report import evidence
from launcher.stragglers.verdict import Finding

__all__ = ["EXIT_NODE_EXCLUDED", "PREFIX", "Exclusion", "NodeExcluded", "reason_for"]

log = logging.getLogger("launcher.stragglers")

#: The exit status of an agent whose node was put out as a straggler: the health checks' 69
#: (``EX_UNAVAILABLE``), which no other path uses: a scheduler drains the node either way.
EXIT_NODE_EXCLUDED = EXIT_NODE_SICK
#: How a straggler's departure reason starts (the rendezvous keeps reasons as plain text).
PREFIX = STRAGGLER


class NodeExcluded(NodeSick):
    """This node was put out of the job as a straggler: it joins no other round (a kind of
    :class:`~launcher.health.api.NodeSick`: the agent ends the same way, without closing the job)."""

    exit_code = EXIT_NODE_EXCLUDED

    def __init__(self, node: str, reason: str) -> None:
        why = reason.removeprefix(PREFIX)
        LaunchError.__init__(self, f"node {node} was put out of the job as a straggler ({why}); its workers were "
                             f"stopped and it joins no other round (exit status {EXIT_NODE_EXCLUDED})")
        self.node, self.check, self.reason = node, "straggler", reason


def reason_for(finding: Finding) -> str:
    """The departure's reason: ``straggler: rank 3 (local rank 1) 1.31x slower than the median rank: <evidence>``."""
    return (f"{PREFIX}rank {finding.rank} (local rank {finding.local_rank}) {finding.ratio:.2f}x slower than the "
            f"median rank: {evidence(finding)}")


def _own_id(handler: Any) -> str | None:
    node = getattr(handler, "node", None)
    return getattr(node, "id", None)


def _decides(info: Any, straggler: str) -> bool:
    """Whether this node is the one that decides: the lowest group rank whose node is not
    ``straggler``, i.e. group rank 0, or 1 when 0 is the straggler's. Group ranks 2 and up answer
    without reading anything; group rank 0 knows its own name; only group rank 1 may read the
    roster (to name group rank 0), so a verdict costs the store O(N) bytes once, not on every node."""
    rank = getattr(info, "group_rank", -1)
    if rank not in (0, 1):
        return False
    try:  # the core's rendezvous: its own name is known, another's is read from the store now
        participants = getattr(info, "participants", None) or []
        if len(participants) < 2:
            return False
        first_is_straggler = participants[0] == straggler
    except Exception:  # the store may be gone: nobody decides, and the straggler stays reported
        return False
    return rank == (1 if first_is_straggler else 0)


class Exclusion:
    """One agent's share of ``--straggler-action exclude`` (see the module docstring)."""

    def __init__(self, emit: Callable[..., None] | None, say: Callable[[list[str]], None]) -> None:
        self._emit = emit
        self._say = say
        self._lock = threading.Lock()
        self._pending: tuple[Finding, Any] | None = None
        #: Node id -> the reason it was put out, for every node excluded so far (the final report).
        self.excluded: dict[str, str] = {}

    def propose(self, named: list[Finding], info: Any) -> None:
        """A verdict of the monitor's thread named ``named`` in ``info``'s round: the worst of them
        is the one to put out (at most one node per verdict)."""
        if not named:
            return
        worst = max(named, key=lambda f: (f.ratio, -f.rank))
        with self._lock:
            self._pending = (worst, info)

    def forget(self) -> None:
        """A new attempt: a verdict of the last round is not acted on in this one."""
        with self._lock:
            self._pending = None

    def act(self, handler: Any, info: Any) -> None:
        """At a membership check of ``info``'s round: act on the verdict proposed, if any (once)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None or getattr(pending[1], "round", None) != getattr(info, "round", None):
            return
        finding = pending[0]
        decides = _decides(info, finding.node)
        put_out = getattr(handler, "put_out", None)
        reason = reason_for(finding)
        try:
            if getattr(info, "group_world_size", 1) <= 1:
                why: str | None = "the job has no other node to go on with"
            elif not callable(put_out):
                why = "this rendezvous backend cannot re-form the job without a node"
            else:
                why = put_out(finding.node, reason, publish=decides)
        except Exception as exc:  # the store: the straggler stays reported
            why = f"the rendezvous store did not answer ({exc})"
        if why is not None:
            self._say([f"launcher: straggler not excluded: node {finding.node} (rank {finding.rank}, "
                       f"{finding.ratio:.2f}x slower than the median rank) stays in the job: {why}"])
        elif decides:
            log.info("putting node %s out of the job: %s", finding.node, reason)

    def before_join(self, handler: Any) -> None:
        """Before joining a round: name the nodes put out of the last one as stragglers (once
        each); raise :class:`NodeExcluded` if this node is one of them."""
        lost_nodes = getattr(handler, "lost_nodes", None)
        if not callable(lost_nodes):
            return
        try:
            lost_nodes()  # reads the reports of the round this node leaves
        except Exception as exc:  # a store problem is the rendezvous's to report
            log.debug("cannot read the departures: %s", exc)
            return
        self._name(handler)

    def after_join(self, handler: Any) -> None:
        """After joining a round: a spare called in names the straggler whose place it takes (the
        rendezvous read the departures of the round before when it joined); the nodes that were
        in that round named it before joining, and nobody is named twice."""
        self._name(handler)

    def _name(self, handler: Any) -> None:
        departures = getattr(handler, "departures", None)
        if not callable(departures):
            return
        try:
            reasons = departures()
        except Exception as exc:  # a store problem is the rendezvous's to report
            log.debug("cannot read the departures: %s", exc)
            return
        own = _own_id(handler)
        for node, reason in reasons.items():
            if not str(reason).startswith(PREFIX) or node in self.excluded:
                continue
            self.excluded[node] = reason
            if self._emit is not None:
                # The health checks' event: a node is out of the job, ``check`` says by what.
                self._emit("node_excluded", excluded_node=node, addr=None, check="straggler", reason=reason)
            if node == own:
                raise NodeExcluded(node, reason)  # said by the agent, as its last line
            self._say([f"launcher: straggler excluded: node {node} was put out of the job "
                       f"({reason.removeprefix(PREFIX)}); the job goes on without it"])
