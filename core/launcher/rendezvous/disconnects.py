"""c10d: an agent whose process died is noticed when its store connection closes, not a heartbeat timeout later.

The node that serves the c10d store (:class:`~launcher.store.server.StoreServer`) ties every
participant's heartbeat counter (``<r>/hb/<rank>``) to the connection that last wrote it
(:meth:`~launcher.store.server.StoreServer.on_writer_closed`). When a process dies, however it
dies (SIGKILL, OOM killer, a crash), its kernel closes its sockets, and the server reads the end of
that connection at once. If the counter does not carry the "left" mark then (a node that leaves
on purpose writes it before it closes anything) and round ``r`` is still the job's newest round,
the node is reported gone with :data:`~launcher.rendezvous.departures.AGENT_DIED`, the same
record the heartbeat ring writes: every survivor re-forms at its next membership check.

A connection cut off without closing (a pulled cable, a crashed host) sends nothing: the heartbeat
ring finds that node within the heartbeat timeout, and the server's TCP keep-alive probes, set to
about the same time, confirm it (:data:`~launcher.rendezvous.departures.UNREACHABLE`). This
report, like the closed connection's, comes even after the ring's, which it then firms up: the
exit barrier waits for a node lost by its silence alone. A paused agent (SIGSTOP, a frozen VM) is
reported by the ring alone: its kernel still answers the probes, and the exit barrier waits for
such a node, which may still finish (:mod:`launcher.agent.barrier`). And the
store's own host dying takes the store with it: c10d's single point of failure (use etcd where
that matters, see docs/etcd.md). A live agent whose connection is closed (a broken network path
that resets it) is reported too; it then re-forms with the others, as a lost node that came back.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from launcher.rendezvous.api import RendezvousError
from launcher.rendezvous.departures import (
    AGENT_DIED,
    HEARTBEAT_TIMEOUT,
    UNREACHABLE,
    LostNodes,
    report_departure,
)
from launcher.rendezvous.keys import KeyKind, RendezvousKeys, parse_key
from launcher.rendezvous.liveness import has_left
from launcher.rendezvous.membership import decode
from launcher.rendezvous.store_ops import StoreOps
from launcher.store.api import StoreError

__all__ = ["ClosedConnections"]

log = logging.getLogger("launcher.rendezvous")


class ClosedConnections:
    """Reports the participants of ``run_id`` whose agent's connection to ``server`` closed
    without leaving their round. :meth:`start` hooks it into the server; nothing else to call."""

    def __init__(self, server: Any, run_id: str, read_timeout: float = 5.0,
                 unreachable_after: float | None = None) -> None:
        self._server = server
        self._run_id = run_id
        self._keys = RendezvousKeys(run_id)
        self._ops = StoreOps(server.store, run_id, read_timeout)
        self._lock = threading.Lock()
        self._pending: list[tuple[int, int, bool]] = []
        self._unreachable_after = unreachable_after
        self._thread: threading.Thread | None = None

    def start(self) -> ClosedConnections:
        """Have the server report the closed connections of this run's heartbeat writers."""
        self._server.on_writer_closed(self._is_heartbeat, self._closed, unreachable_after=self._unreachable_after)
        return self

    def _is_heartbeat(self, key: str) -> bool:
        if not key.startswith(self._keys.run_prefix):
            return False
        parsed = parse_key(key)
        return parsed is not None and parsed.kind is KeyKind.HEARTBEAT

    def _closed(self, keys: list[str], unreachable: bool = False) -> None:
        # On the store's serving thread, its lock held: only queue, the verdict needs store reads.
        found = []
        for key in keys:
            parsed = parse_key(key)
            if parsed is not None and parsed.round is not None and parsed.index is not None:
                found.append((parsed.round, parsed.index, unreachable))
        if not found:
            return
        with self._lock:
            self._pending.extend(found)
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="launcher-rdzv-departures", daemon=True)
                self._thread.start()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                r, rank, unreachable = self._pending.pop(0)
            try:
                self._judge(r, rank, unreachable)
            except (RendezvousError, StoreError) as exc:  # the store is closing: the job is over
                log.debug("rendezvous %r: cannot judge a closed connection: %s", self._run_id, exc)
            except Exception:  # a bug must show, and must not stop later verdicts
                log.exception("rendezvous %r: judging a closed connection failed", self._run_id)

    def _judge(self, r: int, rank: int, unreachable: bool = False) -> None:
        """Report the participant of group rank ``rank`` in round ``r`` gone, if it did not leave
        (``unreachable``: its connection timed out rather than closed)."""
        ops, keys = self._ops, self._keys
        if has_left(ops.add(keys.heartbeat(r, rank), 0)):
            return  # it left on purpose before closing
        if ops.check([keys.closed]):
            return  # the job is over: agents go as they please
        raw = ops.compare_set(keys.current, b"", b"0")
        if raw != str(r).encode() or not ops.check([keys.sealed(r)]):
            return  # an older round: its participants have moved on already
        if decode(ops.get(keys.sealed(r))).get("state") != "sealed":
            return
        # The round's full participants list (the store's host reads it: one node, per death).
        ids = decode(ops.get(keys.roster(r))).get("ids") or []
        if not 0 <= rank < len(ids):
            return
        node = str(ids[rank])
        known = LostNodes()
        if node in known.read(ops, keys, r) and known.reasons().get(node) != HEARTBEAT_TIMEOUT:
            return  # reported already, and not only for its silence (which this report firms up)
        if unreachable:
            log.warning("rendezvous %r: node %s (group rank %d): its store connection timed out in round %d: %s",
                        self._run_id, node, rank, r, UNREACHABLE)
        else:
            log.warning(
                "rendezvous %r: node %s (group rank %d) closed its store connection without leaving round %d: "
                "its agent process died",
                self._run_id,
                node,
                rank,
                r,
            )
        report_departure(ops, keys, r, node, UNREACHABLE if unreachable else AGENT_DIED)
