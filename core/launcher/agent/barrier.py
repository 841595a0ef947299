"""The exit barrier: every node waits for the others to finish before it closes the rendezvous.

Two phases: every node waits until all have finished (``done``), closes the rendezvous, and
says it is leaving (``left``); a node then waits, briefly, until every node has left the store
alone, so the node that serves the store never shuts it down under a peer that is still using
it.

A node that waits here has succeeded, but the job has not: it ends the wait at once, and exits
non-zero with the reason, when it learns (once a second) that the job cannot finish any more:

- another node ended the job (closed it without every node done): the report names that node's
  root cause, read from its record (:mod:`launcher.agent.outcome`);
- a node of the round is leaving it for another round (a restart), which this node will not
  join (:mod:`launcher.agent.finished`): this node ends the job, naming the failure;
- a node that had not finished is gone for certain (its agent's store connection closed, or its
  host stopped answering at the network level: see :mod:`launcher.rendezvous.disconnects`): its
  ranks will never finish; a node that finished and then vanished is not waited for, and fails
  nobody;
- the store is gone (its host died, or the link to it was cut) before every node had finished.

A node whose heartbeats only stopped (``heartbeat timeout``, nothing else known) is not taken for
dead here: a paused agent (SIGSTOP, a frozen cgroup or VM, swap) stops beating while its workers
train on and finish, and it says so at the barrier once it runs again. Failing the job for it
would turn a finished job into a failed one on every node. So such a node is waited for, up to
``--exit-barrier-timeout``, like a slow one; if it has not finished by then, the job fails, naming
it (a silent node's ranks are not known to have finished, so this is never a success).

The waits poll (short ``check`` calls, pauses in between) rather than block on the store: the
connection is shared with this node's heartbeat thread, which must keep beating while the node
waits here, or the others would call it lost (``launcher.rendezvous.store_ops``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

from launcher.agent.finished import (
    FinishedNode,
    announce_finished,
    await_withdrawals,
    describe_ranks,
    exit_prefix,
    finished_count,
    mark_job_succeeded,
    no_reform_note,
    node_ranks,
    read_finished,
    reform_claimed,
)
from launcher.agent.reporting import store_gone
from launcher.rendezvous.api import SMALL_ROUND_MAX, STORE_FAILURES
from launcher.rendezvous.departures import HEARTBEAT_TIMEOUT
from launcher.rendezvous.store_ops import POLL_MAX

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.reporting import NodeReporter
    from launcher.agent.result import AgentResult
    from launcher.failures.report import RankState
    from launcher.rendezvous.api import RendezvousHandler, RendezvousInfo
    from launcher.store.api import KeyValueStore

__all__ = ["exit_barrier"]

log = logging.getLogger("launcher.agent")

#: Up to this many nodes, a node at the barrier reads who finished as they arrive (each record
#: once), so that it can name the nodes lost with a store that goes away; above, it reads the
#: records only when it needs them (a lost node, a restart), keeping the wait O(1) per second.
_FOLLOW_UP_TO = 64
#: How long a node that closed the job on a restarting node waits for it to have read the
#: records (it sees the job closed within a second or two of its rendezvous' polling).
_WITHDRAW_TIMEOUT = 15.0


class _NotAllFinished(Exception):
    """The barrier's timeout passed before every node had finished."""


def exit_barrier(info: RendezvousInfo, handler: RendezvousHandler, reporter: NodeReporter, *,
                 run_id: str, timeout: float, ranks: list[RankState] | None = None) -> AgentResult | None:
    """Wait (``timeout`` seconds at most) for every node to finish, then close the rendezvous.

    ``None`` when the job succeeded here (or the wait timed out: every worker of this node
    succeeded, and a slow peer does not undo that); a failed :class:`AgentResult` when the job
    cannot finish any more (see the module's docstring). ``ranks``: this node's ranks, for its report.
    """
    if info.group_world_size == 1 or info.store is None:
        with contextlib.suppress(*STORE_FAILURES):
            handler.set_closed()
        return None
    waiter = _Waiter(info, handler, reporter, run_id, ranks or [])
    try:
        end = waiter.await_done(timeout)
        if end is not None:
            return end
        # Before the close: a node left out of this round that finds the job closed reads it.
        mark_job_succeeded(handler, run_id, info.round)
        handler.set_closed()
        if waiter.store.add(f"{waiter.prefix}/left", 1) == info.group_world_size:
            waiter.store.set(f"{waiter.prefix}/all_left", b"1")
    except _NotAllFinished:
        silent = waiter.silent_unfinished()
        if silent:  # their ranks are not known to have finished: no success without them
            return waiter.reporter.job_failed(info, handler, [], waiter.ranks, closer=True, reason=silent)
        # Every worker here succeeded, and every other node is alive: a slow one does not undo that.
        log.warning("exit barrier: not every node finished within %g s (--exit-barrier-timeout); exiting anyway",
                    timeout)
        return None
    except STORE_FAILURES as exc:
        return waiter.store_failed(exc)
    waiter.await_left(min(timeout, 30.0))
    return None


class _Waiter:
    """One node's wait at the exit barrier of one round."""

    def __init__(self, info: RendezvousInfo, handler: RendezvousHandler, reporter: NodeReporter, run_id: str,
                 ranks: list[RankState]) -> None:
        assert info.store is not None
        self.info, self.handler, self.reporter, self.ranks = info, handler, reporter, ranks
        self.store: KeyValueStore = info.store
        self.run_id = run_id
        self.prefix = exit_prefix(run_id, info.round)
        #: How many nodes had finished, and who they are (see ``_FOLLOW_UP_TO``), when last looked.
        self.count = 0
        self.finished: list[FinishedNode] = []
        #: Nodes lost by heartbeat silence alone, already said to be waited for (see the module's docstring).
        self._silent_said: set[str] = set()
        # Read now, in rounds small enough, so that a node lost with the store (its host died)
        # is still named with its ranks; in larger rounds, an O(N) read a node, only once a node
        # is to be named (the store's host gone: "its ranks").
        self._node_ranks = node_ranks(info, run_id) if info.group_world_size <= SMALL_ROUND_MAX else None

    @property
    def node_ranks(self) -> dict[int, range]:
        """Every node's global ranks, by group rank (empty when they cannot be read)."""
        if self._node_ranks is None:
            self._node_ranks = node_ranks(self.info, self.run_id)
        return self._node_ranks

    def await_done(self, timeout: float) -> AgentResult | None:
        """Wait for every node to finish: ``None`` once all have; the failed result when the job
        cannot finish any more (checked once a second)."""
        info = self.info
        me = FinishedNode(info.group_rank, _node_id(info, info.group_rank), self.reporter.label)
        done = f"{self.prefix}/done"
        if announce_finished(self.store, self.prefix, me) == info.group_world_size:
            self.store.set(done, b"1")
        log.info("every worker of this node succeeded; waiting at the exit barrier for the other %d node(s) "
                 "(--exit-barrier-timeout %g s)", info.group_world_size - 1, timeout)
        deadline = time.monotonic() + timeout
        pause = 0.01
        next_look = 0.0  # at once, then once a second: can the job still finish?
        while True:
            # Checks, not a blocking wait: see the module's docstring.
            if self.store.check([done]):
                return None
            now = time.monotonic()
            if now >= next_look:
                next_look = now + 1.0
                end = self._look()
                if end is not None:
                    return end
                continue
            if now >= deadline:
                raise _NotAllFinished
            time.sleep(min(pause, deadline - now, next_look - now))
            pause = min(pause * 2, POLL_MAX)

    def _look(self) -> AgentResult | None:
        """The failed result when the job cannot finish any more, else ``None``."""
        info, handler, reporter = self.info, self.handler, self.reporter
        self.count = finished_count(self.store, self.prefix)
        if self.count >= info.group_world_size:
            return None  # the last one is setting ``done``
        if info.group_world_size <= _FOLLOW_UP_TO:
            # Who finished, should the store go: each record is read once.
            self.finished = read_finished(self.store, self.prefix, self.finished, self.count)
        if handler.is_closed() and not self.store.check([f"{self.prefix}/done"]):
            # This node's record tells a failing node it need not wait for us.
            reporter.publish(info, handler, reporter.outcome(info))
            log.error("every worker of this node succeeded, but the job ended on another node")
            return reporter.job_failed(info, handler, [], self.ranks, closer=False)
        if reform_claimed(self.store, self.prefix):
            # A node is restarting (or re-forming) into a round this node will never join.
            self.finished = read_finished(self.store, self.prefix, self.finished)
            me = FinishedNode(info.group_rank, _node_id(info, info.group_rank), reporter.label)
            note = no_reform_note([*self.finished] or [me], "restarting or re-forming the group")
            log.error("a node of this round is restarting its workers, but this node had finished: ending the job")
            result = reporter.job_failed(info, handler, [], self.ranks, closer=True, notes=[note])
            # Serve the store (c10d's or static's host) until the restarting node saw the job
            # closed and read this node's record: it is no longer in this round's ring.
            await_withdrawals(self.store, self.prefix, _WITHDRAW_TIMEOUT)
            return result
        lost = self._lost_unfinished()
        if lost:  # the result's message says it
            return reporter.job_failed(info, handler, [], self.ranks, closer=True, reason=lost)
        return None

    def _lost_unfinished(self) -> str | None:
        """One line naming the nodes gone for certain that had not finished (and their ranks), if
        any; a node lost only by heartbeat silence is waited for instead (see the module's docstring)."""
        lost = self._lost_before_finishing()
        if not lost:
            return None  # none lost, or they finished, then vanished: nothing of theirs is missing
        reasons = _departure_reasons(self.handler)
        gone = [g for g in lost if reasons.get(self.info.participants[g], "") != HEARTBEAT_TIMEOUT]
        for g in lost:
            node = self.info.participants[g]
            if g not in gone and node not in self._silent_said:
                self._silent_said.add(node)
                log.warning("%s sent no heartbeat within the heartbeat timeout and has not finished: waiting for it "
                            "up to --exit-barrier-timeout, as a paused or cut-off node may still finish", self._name(g))
        if not gone:
            return None
        return "; ".join(f"{self._name(g)} was lost before it finished "
                         f"({reasons.get(self.info.participants[g]) or 'no heartbeat'}): "
                         f"{describe_ranks(self.node_ranks.get(g))} did not finish" for g in gone)

    def _lost_before_finishing(self) -> list[int]:
        """The group ranks of the lost nodes that had not finished (one read while none is lost)."""
        names = set(self.handler.lost_nodes())
        if not names:
            return []
        self.finished = read_finished(self.store, self.prefix, self.finished)
        done = {n.group_rank for n in self.finished}
        return [g for g, node in enumerate(self.info.participants) if node in names and g not in done]

    def silent_unfinished(self) -> str | None:
        """At the barrier's timeout: one line naming the nodes lost by heartbeat silence that never
        came back to say they finished, if any."""
        try:
            silent = self._lost_before_finishing()
        except STORE_FAILURES:
            silent = []
        if not silent:
            return None
        return "; ".join(f"{self._name(g)} was lost before it finished (no heartbeat, and it did not come back "
                         f"within --exit-barrier-timeout): {describe_ranks(self.node_ranks.get(g))} did not finish"
                         for g in silent)

    def _name(self, g: int) -> str:
        node_id = _node_id(self.info, g)
        return f"node {g} ({node_id})" if node_id else f"node {g}"

    def store_failed(self, exc: BaseException) -> AgentResult | None:
        """The store stopped answering while this node waited: fine once every node had
        finished; otherwise the nodes that had not are lost to this one."""
        info, reporter = self.info, self.reporter
        if self.count >= info.group_world_size:
            log.warning("exit barrier: the rendezvous store stopped answering after every node had finished (%s)", exc)
            return None
        reporter.store_note = store_gone(self.handler) or f"the rendezvous store stopped answering: {exc}"
        note = (f"every worker of this node succeeded, but not every node had finished ({max(self.count, 1)} of "
                f"{info.group_world_size} had)")
        if len(self.finished) >= self.count:  # who they are is known
            done = {n.group_rank for n in self.finished} | {info.group_rank}
            missing = [g for g in range(info.group_world_size) if g not in done]
            note += ": lost with the store: " + ", ".join(
                f"{self._name(g)} with {describe_ranks(self.node_ranks.get(g))}" for g in missing)
        return reporter.job_failed(info, self.handler, [], self.ranks, closer=False, notes=[note])

    def await_left(self, timeout: float) -> None:
        """Until every node has said it is leaving, or is lost (it will never say so)."""
        key = f"{self.prefix}/all_left"
        deadline = time.monotonic() + timeout
        pause, next_look = 0.01, time.monotonic() + 1.0
        try:
            while not self.store.check([key]):
                now = time.monotonic()
                if now >= deadline:
                    log.debug("exit barrier: not every node said it was leaving within %.0f s", timeout)
                    return
                if now >= next_look:
                    next_look = now + 1.0
                    left = self.store.add(f"{self.prefix}/left", 0)
                    if left + len(self.handler.lost_nodes()) >= self.info.group_world_size:
                        return  # the others left, or finished and then vanished
                time.sleep(min(pause, max(0.0, deadline - now)))
                pause = min(pause * 2, POLL_MAX)
        except STORE_FAILURES as exc:
            # Expected on every node but the store's host: the host may shut the store down the
            # moment the last node has said it is leaving.
            log.debug("exit barrier: store gone after every node left (%s)", exc)


def _departure_reasons(handler: RendezvousHandler) -> dict[str, str]:
    """Why each lost node is gone, where the backend says (the core's rendezvous does); a backend
    that does not say gives no reason, and its lost nodes count as gone for certain, as before."""
    departures = getattr(handler, "departures", None)
    if departures is None:
        return {}
    try:
        return dict(departures())
    except STORE_FAILURES:
        return {}


def _node_id(info: RendezvousInfo, group_rank: int) -> str:
    try:  # another node's id is read from the store (the roster) the first time: it may be gone
        return info.participants[group_rank] if group_rank < len(info.participants) else ""
    except STORE_FAILURES:
        return ""
