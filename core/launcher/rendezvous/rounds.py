"""Forming rounds: how a node gets a place in a round, and how the job's end reaches every node.

Steps 2 to 5 of "A node joining" in docs/rendezvous.md: pick the round, take a join index,
close (seal) the round when this node's index makes it the closer, wait as a late node for the
next round, give up after ``join_timeout``; and "Closing the job", which every one of those
waits also watches for. The handler (:mod:`launcher.rendezvous.dynamic`) does the rest.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, cast

from launcher.rendezvous.api import (
    SMALL_ROUND_MAX,
    RendezvousClosedError,
    RendezvousError,
    RendezvousTimeoutError,
)
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.keys import RendezvousKeys
from launcher.rendezvous.membership import (
    Membership,
    NodeDescriptor,
    decode,
    encode,
    encode_large,
    list_ids,
    places,
    sealed_addresses,
    sealed_summary,
)
from launcher.rendezvous.store_ops import ConnectionLost, StoreOps
from launcher.store.api import StoreError, StoreTimeoutError

__all__ = ["CLOSED", "Rounds", "sealed_value", "segment_tally"]

log = logging.getLogger("launcher.rendezvous")

#: What ``current`` and ``<r>/open`` hold once the job has ended.
CLOSED = b"closed"
#: ``--segment``: how often (seconds) a re-form's closer, MAX reached in whole segments, looks
#: whether every node expected in it has joined (one read of ``<r>/seq``).
_SEGMENT_POLL = 0.05


def sealed_value(
    nodes: list[dict[str, Any]], count: int, min_nodes: int, *, stable_rank0: bool, closer: str,
    segment: int | None = None, max_nodes: int | None = None, previous: Collection[str] = (),
) -> dict[str, Any]:
    """The full record of a round whose closer read the participant records ``nodes`` (join
    indexes ``1..count``; a record's ``idx``, when the closer added it, is its join index): the
    participants in rank order, or ``aborted`` below MIN. The closer stores it as the round's
    ``roster`` and writes its :func:`~launcher.rendezvous.membership.sealed_summary` under
    ``<r>/sealed``.

    ``segment`` (``--segment N``): only whole segments of N nodes of one domain take part, up to
    ``max_nodes`` (:func:`launcher.topology.segments.select_segments`; ``previous``, the ids of
    the round before, are kept first); the others wait as spares."""
    if len(nodes) < min_nodes:
        return {"state": "aborted", "reason": f"only {len(nodes)} of {count} nodes announced themselves"}
    stable = stable_rank0
    placed = any("topo" in n for n in nodes)
    if placed:  # --topology: nodes of one innermost domain adjacent (docs/topology.md)
        from launcher.topology.order import placement_key

    def order(n: Mapping[str, Any]) -> tuple[Any, ...]:
        return (
            not (stable and n.get("host")),
            not (stable and n.get("r0")),
            placement_key(n) if placed else (),
            str(n.get("addr")),
            int(n.get("pid", 0)),
            int(n.get("lid", 0)),
        )

    # Each record's sort key, computed once: with --segment the records are sorted twice (inside
    # their domain, then the chosen ones), and a path's key is the costly part of the closer's work.
    keys = {id(n): order(n) for n in nodes}

    def key(n: Mapping[str, Any]) -> tuple[Any, ...]:
        return keys[id(n)]

    if segment is not None:
        from launcher.topology.segments import select_segments

        chosen = select_segments(nodes, segment, min_nodes, max_nodes or len(nodes), key, previous,
                                 host=lambda n: bool(n.get("host")), host_first=stable)
        if chosen is None:
            return {"state": "aborted",
                    "reason": f"fewer than {min_nodes} nodes in whole segments of {segment} of one domain"}
        nodes = cast("list[dict[str, Any]]", chosen)
    else:
        # Deterministic order: every node would compute the same ranks from the same set.
        nodes = sorted(nodes, key=key)
    hosts = [rank for rank, n in enumerate(nodes) if n.get("host")]
    return {
        "state": "sealed",
        "count": count,
        "ids": [n["id"] for n in nodes],
        "lws": [n.get("lws") for n in nodes],
        # Who the store's host admits once the round is closed (docs/store-security.md).
        "addrs": [[str(a) for a in (n.get("addr"), n.get("via")) if a] for n in nodes],
        "closer": closer,
        "hr": hosts[0] if hosts else None,
        # Each participant's join index: which place/<i> record names its rank.
        "idx": [n.get("idx") for n in nodes],
        # Each participant's path, with --topology only (the closer's INFO line, launcher status).
        **({"paths": [_path_text(n) for n in nodes]} if placed else {}),
    }


def segment_tally(nodes: list[dict[str, Any]], segment: int) -> dict[str, Any]:
    """``--segment``: ``nodes`` counted per domain (by its number, as text: a JSON key), and the
    whole segments they make (``{"dom": {...}, "whole": n}``); nodes without a path count in none."""
    from launcher.topology.order import record_path
    from launcher.topology.segments import domain_number

    per_domain: dict[str, int] = {}
    for node in nodes:
        path = record_path(node)
        if path is not None:
            number = str(domain_number(path))
            per_domain[number] = per_domain.get(number, 0) + 1
    return {"dom": per_domain, "whole": sum(n // segment for n in per_domain.values())}


def _path_text(node: dict[str, Any]) -> str | None:
    from launcher.topology.order import record_path

    path = record_path(node)
    return ".".join(path) if path is not None else None


def _placement_line(value: dict[str, Any]) -> str:
    """``rank 0 10.0.0.1_7_0 at spine0.leaf1, ...``: up to SMALL_ROUND_MAX nodes, then how many more."""
    ids, paths = value.get("ids") or [], value.get("paths") or []
    shown = [f"{rank} {node} at {path or '(no path)'}"
             for rank, (node, path) in enumerate(zip(ids[:SMALL_ROUND_MAX], paths, strict=False))]
    more = f" and {len(ids) - SMALL_ROUND_MAX} more" if len(ids) > SMALL_ROUND_MAX else ""
    return ", ".join(shown) + more


class Rounds:
    """The rounds of one job, as one node takes part in them through the store.

    ``node`` is this node; it joins rounds of ``min_nodes`` to ``max_nodes`` nodes.
    ``progress_interval`` is the period of "still waiting" messages. :attr:`closed` is set
    once this node has seen the job closed. :attr:`on_attempt` (``r``) runs when this node
    tries to take part in round ``r``, which is open then; :attr:`on_sealed` (``r``, the
    participants' addresses) when it reads that round ``r`` closed with participants, whether
    or not this node is one (the node that serves the store admits them, see
    docs/store-security.md).
    """

    def __init__(
        self,
        ops: StoreOps,
        keys: RendezvousKeys,
        node: NodeDescriptor,
        *,
        min_nodes: int,
        max_nodes: int,
        config: DynamicRendezvousConfig,
        progress_interval: float,
    ) -> None:
        self._ops = ops
        self._keys = keys
        self._node = node
        self._min = min_nodes
        self._max = max_nodes
        self._config = config
        self._run_id = ops.run_id
        self.progress_interval = progress_interval
        self.closed = False
        self._record = b""
        self._spare_called = False
        #: This node waits as a spare now (or did, before a failure): it has no part in the job yet.
        self.spare = False
        #: ``--segment N``: N, and this node's domain number (``None``: it has no path, so it
        #: only ever waits as a spare). ``None``: off, every joined node up to MAX takes part.
        self.segment: int | None = None
        self.domain: int | None = None
        #: ``--segment``: the closer's last check this node saw (as a backup closer).
        self._checks_seen = b""
        self._checks_done = 0
        self.on_attempt: Callable[[int], None] | None = None
        self.on_sealed: Callable[[int, tuple[tuple[str, ...], ...]], None] | None = None

    def join(self, previous: Membership | None, record: bytes, deadline: float) -> Membership:
        """This node's membership of the next round it gets into, writing ``record`` as its
        participant record; ``previous`` is its last round (``None``: it is new to the job).

        Raises :class:`RendezvousClosedError` when the job is over, and
        :class:`RendezvousTimeoutError` when fewer than MIN nodes joined by ``deadline``.
        """
        self._record = record
        outcome: Membership | int | None = None
        while not isinstance(outcome, Membership):
            self._spare_called = False
            try:
                outcome = self._first_round(previous) if outcome is None else self._attempt(outcome, deadline, previous)
            except ConnectionLost as exc:
                # The store closed our connection mid-call: a c10d store whose round closed
                # without this node (a spare, a late node) does that. The client reconnects once
                # it is admitted again (a new round opens): start over from the newest round.
                if time.monotonic() >= deadline and not self.spare:
                    raise
                log.info("rendezvous %r: %s; trying again once the store admits this node", self._run_id, exc)
                if self.spare:  # admitted again means a new round opened: it gets a full join timeout
                    deadline = max(deadline, time.monotonic() + self._config.join_timeout)
                outcome = None
                continue
            if self._spare_called:
                # A spare waited as long as the job ran; its join timeout starts when it is called.
                deadline = time.monotonic() + self._config.join_timeout
        self.spare = False
        return outcome

    def _first_round(self, previous: Membership | None) -> int:
        current = self._read_current()
        if previous is not None and current <= previous.round:
            # This node was in the newest round: a new one is needed (a restart or a scale-up).
            return self._open(previous.round + 1)
        return current

    def _open(self, r: int) -> int:
        """Make round ``r`` the current one (if no one did); the current round afterwards."""
        raw = self._ops.compare_set(self._keys.current, str(r - 1).encode(), str(r).encode())
        if raw == CLOSED:
            raise self._closed_error()
        value = int(raw)
        if value == r:
            # Wakes the nodes that wait for a round after r - 1 (see "Late nodes").
            self._ops.set(self._keys.open(r), b"1")
        return max(value, r)

    def _read_current(self) -> int:
        """The current round number, creating it (0) for the first node of the job.

        ``current`` holds ``closed`` once the job has ended, so this one read also tells a
        late node to leave.
        """
        raw = self._ops.compare_set(self._keys.current, b"", b"0")
        if raw == CLOSED:
            self.closed = True
            raise self._closed_error()
        return int(raw)

    def _closed_error(self) -> RendezvousClosedError:
        why = ""
        try:
            if self._ops.check([self._keys.closed]):
                raw = self._ops.get(self._keys.closed)
                if raw not in (b"", b"1"):
                    why = f" ({raw.decode(errors='replace')})"
        except (RendezvousError, StoreError):
            pass  # the reason is a courtesy: the job has ended all the same
        return RendezvousClosedError(f"rendezvous {self._run_id!r} is closed: the job has ended{why}")

    def _attempt(self, r: int, deadline: float, previous: Membership | None) -> Membership | int:
        """Try to be a participant of round ``r``: this node's membership, or the round to try next."""
        if self.on_attempt is not None:
            self.on_attempt(r)
        index = self._ops.add(self._keys.seq(r), 1)
        # With --segment a node beyond MAX may still complete a segment: it joins until sealed.
        if index > self._max and (self.segment is None or self._ops.check([self._keys.sealed(r)])):
            if self.segment is not None:
                # A spare's record says its domain: whether it can fill a segment's place is
                # decided by it (DynamicRendezvousHandler.put_out), as for spares that joined in time.
                self._ops.set(self._keys.node(r, index), self._record)
            if self.on_sealed is not None and self._ops.check([self._keys.sealed(r)]):
                state = decode(self._ops.get(self._keys.sealed(r)))
                if state.get("state") == "sealed":
                    self.on_sealed(r, sealed_addresses(self._roster(r)))
            return self._wait_as_spare(r)
        self._ops.set(self._keys.node(r, index), self._record)
        log.info(
            "rendezvous %r: node %s joined round %d as number %d (min %d, max %d)",
            self._run_id,
            self._node.id,
            r,
            index,
            self._min,
            self._max,
        )
        now = time.monotonic()
        close_at = backup_at = math.inf
        grace = max(1.0, self._config.last_call_timeout / 2)
        expected: int | None = None
        self._checks_seen = b""
        if self.segment is not None:
            # Whether this node brings the round's whole segments to MAX: the MAX-th node reads
            # the first MAX records (as a closer does anyway) and counts them; a node beyond MAX
            # adds itself to its domain's counter (docs/topology.md, "Whole segments").
            first_max = self._read_nodes(r, index) if index == self._max else None
            tally = segment_tally(first_max, self.segment) if first_max is not None else None
            complete = (tally["whole"] * self.segment == self._max if tally is not None
                        else index > self._max and self._completes_segments(r))
            if complete:
                expected = self._expected_joiners(r)
                if expected is None:
                    # MAX in whole segments: close at once (with the records just read, if read).
                    if first_max is not None:
                        self._seal(r, index, first_max)
                    else:
                        self._seal(r, self._ops.add(self._keys.seq(r), 0))
                else:
                    # A re-form: the survivors and the spares called with it are joining now.
                    # Closing once they all have lets the lost node's own domain's spare be seen
                    # (docs/topology.md); after the last call at the latest.
                    close_at = now + self._config.last_call_timeout
            if tally is not None:  # for the nodes beyond MAX (after the seal: off the round's path)
                self._ops.set(self._keys.tally(r), encode(tally))
            if index == self._min:
                close_at = min(close_at, now + self._config.last_call_timeout)
            elif index > self._min:
                backup_at = now + self._config.last_call_timeout + grace
        elif index == self._max:
            self._seal(r, self._max)  # the round is full: close it at once
        elif index == self._min:
            close_at = now + self._config.last_call_timeout  # this node closes after the last call
        elif index > self._min:
            backup_at = now + self._config.last_call_timeout + grace
        next_progress = now + self.progress_interval
        while True:
            now = time.monotonic()
            wake = min(deadline, next_progress, close_at, backup_at)
            if expected is not None:
                wake = min(wake, now + _SEGMENT_POLL)
            if self._ops.wait([self._keys.sealed(r)], wake - now):
                return self._after_sealed(r, index, deadline)
            now = time.monotonic()
            if expected is not None and self._ops.add(self._keys.seq(r), 0) >= expected:
                close_at, expected = now, None  # everyone expected has joined: close now
            if now >= deadline:
                return self._join_timed_out(r, index, deadline, previous, closer=close_at != math.inf)
            if now >= close_at or now >= backup_at:
                count = self._ops.add(self._keys.seq(r), 0)
                if self.segment is not None:
                    if close_at == math.inf and self._closer_checking(r):
                        # A backup: the closer lives, and waits for whole segments itself.
                        backup_at = now + self._config.last_call_timeout + grace
                        continue
                    whole = self._whole_nodes(r, count)
                    if whole < self._min:
                        # MIN nodes joined but not MIN's worth of whole segments: wait on for more
                        # (this node is the closer now; its checks tell the backups it lives).
                        self._note_check(r, count, whole)
                        close_at = now + self._config.last_call_timeout
                        backup_at = math.inf
                        continue
                self._seal(r, count if self.segment is not None else min(count, self._max))
                close_at = backup_at = math.inf
                continue
            if now >= next_progress:
                next_progress = now + self.progress_interval
                self._raise_if_closed()
                count = self._ops.add(self._keys.seq(r), 0)
                if count >= self._min and backup_at == math.inf and close_at == math.inf:
                    # Quorum is reached but this node is not its closer: close later if the closer
                    # has died in the meantime.
                    backup_at = now + self._config.last_call_timeout + grace
                self._report_progress(r, index, count, deadline, close_at, previous)

    def _report_progress(
        self,
        r: int,
        index: int,
        count: int,
        deadline: float,
        close_at: float,
        previous: Membership | None,
    ) -> None:
        now = time.monotonic()
        if count >= self._min:
            when = f"closes in {max(0.0, close_at - now):.0f} s" if close_at < math.inf else "closes soon"
            log.info(
                "rendezvous %r round %d: %d nodes joined (min %d, max %d); the round %s unless %d join first",
                self._run_id,
                r,
                count,
                self._min,
                self._max,
                when,
                self._max,
            )
            return
        missing = ""
        if index == 1:  # one node per round looks up who is missing, so the cost stays O(1) per node
            names = self._missing(r, count, previous)
            if names:
                missing = f"; missing: {list_ids(names)}"
        log.info(
            "rendezvous %r round %d: waiting for nodes, %d joined of min %d (max %d)%s; timeout in %.0f s",
            self._run_id,
            r,
            count,
            self._min,
            self._max,
            missing,
            max(0.0, deadline - now),
        )

    def _missing(self, r: int, count: int, previous: Membership | None) -> list[str] | None:
        """Participants of the previous round that have not joined round ``r``; None if unknown."""
        if previous is None:
            return None
        try:
            records = self._ops.multi_get([self._keys.node(r, k) for k in range(1, count + 1)], 1.0)
        except StoreTimeoutError:
            return None
        joined = {decode(raw).get("id") for raw in records}
        try:  # the previous round's participants: read from its roster (O(N), this node only)
            return [node for node in previous.ids if node not in joined]
        except (RendezvousError, StoreError):
            return None

    def _completes_segments(self, r: int) -> bool:
        """``--segment``, a node that joined beyond MAX: count it in its domain (one ``add``, and
        one more when it completes a segment); whether it completed the segment that brings the
        round's whole segments to MAX. The first MAX nodes are in the MAX-th node's tally."""
        if self.domain is None or self.segment is None:
            return False
        mine = self._ops.add(self._keys.domain(r, self.domain), 1)
        tally = self._read_tally(r)
        if tally is None or (int(tally["dom"].get(str(self.domain), 0)) + mine) % self.segment:
            return False
        return (int(tally["whole"]) + self._ops.add(self._keys.segments(r), 1)) * self.segment == self._max

    def _read_tally(self, r: int) -> dict[str, Any] | None:
        """Round ``r``'s tally of its first MAX nodes, once the MAX-th node wrote it (``None`` if it
        did not within the last call: it died, and a backup closer counts the records itself)."""
        key = self._keys.tally(r)
        if not self._ops.wait([key], min(self._config.read_timeout, max(1.0, self._config.last_call_timeout))):
            return None
        return decode(self._ops.get_present(key))

    def _whole_nodes(self, r: int, count: int) -> int:
        """``--segment``: how many of round ``r``'s ``count`` joined nodes are in whole segments:
        O(1) requests once MAX joined (the tally and the counters beyond it), else the closer
        reads the records."""
        assert self.segment is not None
        if count >= self._max and self._ops.check([self._keys.tally(r)]):
            tally = decode(self._ops.get_present(self._keys.tally(r)))
            return (int(tally["whole"]) + self._ops.add(self._keys.segments(r), 0)) * self.segment
        return int(segment_tally(self._read_nodes(r, count), self.segment)["whole"]) * self.segment

    def _note_check(self, r: int, count: int, whole: int) -> None:
        """The closer found ``whole`` of ``count`` joined nodes in whole segments, fewer than MIN:
        say so under ``<r>/checks`` (one ``set``): the backups see it live, and a node that times
        out takes the count from there instead of reading every record itself."""
        self._checks_done += 1
        self._ops.set(self._keys.checks(r), encode({"by": self._node.id, "n": self._checks_done, "count": count,
                                                     "whole": whole}))

    def _last_check(self, r: int) -> bytes:
        """The closer's last check of round ``r`` as written (``b""``: none yet); two requests."""
        key = self._keys.checks(r)
        return self._ops.get_present(key) if self._ops.check([key]) else b""

    def _closer_checking(self, r: int) -> bool:
        """A backup closer's look: whether the round's closer checked again since this node last
        looked (its check record changed)."""
        seen = self._last_check(r)
        moved, self._checks_seen = seen != self._checks_seen, seen
        return moved

    def _whole_at_timeout(self, r: int, count: int, closer: bool) -> int:
        """``--segment``, at the join timeout with MIN nodes joined: how many are in whole
        segments. O(1) for every node but the closer (which reads the records, as at each of its
        checks): from MAX on, the tally and the counters; below it, the closer's last check; only
        when no closer has checked does a node read the records itself."""
        if count >= self._max or closer:
            return self._whole_nodes(r, count)
        last = self._last_check(r)
        return int(decode(last).get("whole") or 0) if last else self._whole_nodes(r, count)

    def _expected_joiners(self, r: int) -> int | None:
        """``--segment``, round ``r`` a re-form: how many nodes should join it, the previous round's
        participants but those reported gone, plus the nodes that waited beside it (spares);
        ``None`` when round ``r - 1`` did not form (not a re-form: nothing to wait for). Read by
        the one node that completes the round's segments: O(1) reads, and one per gone node."""
        if r == 0 or not self._ops.check([self._keys.sealed(r - 1)]):
            return None
        state = decode(self._ops.get(self._keys.sealed(r - 1)))
        if state.get("state") != "sealed":
            return None
        from launcher.rendezvous.departures import LostNodes

        gone = len(LostNodes().read(self._ops, self._keys, r - 1))
        waiting = self._ops.add(self._keys.seq(r - 1), 0) - int(state.get("count") or 0)
        return int(state.get("n") or 0) - gone + max(0, waiting)

    def _read_nodes(self, r: int, count: int) -> list[dict[str, Any]]:
        """The participant records of join indexes 1..count of round ``r`` (each with its ``idx``),
        one request; a node that took its index and died before announcing itself is left out."""
        keys = [self._keys.node(r, k) for k in range(1, count + 1)]
        try:
            records = self._ops.multi_get(keys, self._config.read_timeout)
            present = keys
        except StoreTimeoutError:
            present = [k for k in keys if self._ops.check([k])]
            records = self._ops.multi_get(present, self._config.read_timeout) if present else []
        index_of = {key: k for k, key in enumerate(keys, start=1)}
        nodes = []
        for key, raw in zip(present, records, strict=True):
            node = decode(raw)
            node["idx"] = index_of[key]
            nodes.append(node)
        return nodes

    def _seal(self, r: int, count: int, nodes: list[dict[str, Any]] | None = None) -> None:
        """Close round ``r`` with the nodes of join index 1..count (see "Closing a round");
        ``nodes``: their records, when this node has just read them.

        Writes, in this order, the round's full record (``roster``), each join index's place,
        then the small ``sealed`` record that wakes the nodes: a node finds its place written
        once it sees ``sealed``. Two closers (the closer and a backup) may race: the first
        ``roster`` written wins, and both write the places and ``sealed`` of that one.
        """
        if self._ops.check([self._keys.sealed(r)]):
            return  # closed already (by another closer, or by set_closed)
        if nodes is None:
            nodes = self._read_nodes(r, count)
        previous = self._previous_ids(r) if self.segment is not None else None
        value = sealed_value(nodes, count, self._min, stable_rank0=self._config.stable_rank0, closer=self._node.id,
                             segment=self.segment, max_nodes=self._max, previous=previous or ())
        if value["state"] != "sealed":
            self._ops.compare_set(self._keys.sealed(r), b"", encode(value))
            return
        mine = encode_large(value)
        stored = self._ops.compare_set(self._keys.roster(r), b"", mine)
        if stored != mine:
            value = decode(stored)  # another closer's, written first: seal that one
        count = int(value.get("count") or 0)
        if count:
            self._ops.multi_set([self._keys.place(r, k) for k in range(1, count + 1)], places(value))
        summary = sealed_summary(value, previous if self.segment is not None else self._previous_ids(r))
        self._ops.compare_set(self._keys.sealed(r), b"", encode(summary))
        if "paths" in value:
            log.info("rendezvous %r round %d placed by topology (group rank, node, path): %s",
                     self._run_id, r, _placement_line(value))

    def _previous_ids(self, r: int) -> list[str] | None:
        """The participants of round ``r - 1`` if it formed (its roster: O(N) bytes, read by the
        closer only), so that ``sealed`` can say who left; ``None`` otherwise."""
        key = self._keys.roster(r - 1)
        if r == 0 or not self._ops.check([key]):
            return None
        try:  # there: a plain read, no wait
            ids = decode(self._ops.get_present(key)).get("ids")
        except (RendezvousError, StoreError):
            return None
        return [str(node) for node in ids] if isinstance(ids, list) else None

    def _roster(self, r: int) -> dict[str, Any]:
        """Round ``r``'s full record (its ``roster``): O(N) bytes, for the nodes that need it."""
        return decode(self._ops.get(self._keys.roster(r)))

    def _place(self, r: int, index: int, state: dict[str, Any]) -> dict[str, Any]:
        """Where join index ``index`` stands in sealed round ``r`` (``state``: its ``sealed``
        record): ``{"rank": None}`` when the closer did not take it into the round."""
        if not 1 <= index <= int(state.get("count") or 0):
            return {"rank": None}
        # Written before ``sealed``: there already, so a plain read, no wait.
        return decode(self._ops.get_present(self._keys.place(r, index)))

    def _after_sealed(self, r: int, index: int, deadline: float) -> Membership | int:
        state = decode(self._ops.get(self._keys.sealed(r)))
        kind = state.get("state")
        if kind == "closed":
            raise self._closed_error()
        if kind == "aborted":
            log.info("rendezvous %r: round %d was abandoned (%s); trying again", self._run_id, r, state.get("reason"))
            return self._open(r + 1)
        if self.on_sealed is not None:
            self.on_sealed(r, sealed_addresses(self._roster(r)))
        place = self._place(r, index, state)
        rank = place.get("rank")
        size = int(state["n"])
        if not isinstance(rank, int):
            if index <= int(state["count"]):
                # The closer counted this index but did not see this node's record in time:
                # take a new index so that the running nodes see one more node waiting.
                self._ops.add(self._keys.seq(r), 1)
            if size >= self._max or self.segment is not None:
                # With --segment, a node left out has no whole segment to train in: a spare.
                return self._wait_as_spare(r, size)
            return self._wait_late(r, deadline, f"round {r} closed without this node")
        host_rank, world, left = state.get("hr"), state.get("ws"), state.get("left")
        return Membership(
            r,
            rank,
            size,
            int(state["count"]),
            host_rank if isinstance(host_rank, int) else None,
            node_id=self._node.id,
            host_id=state.get("hid") if isinstance(state.get("hid"), str) else None,
            world_size=world if isinstance(world, int) else None,
            left=tuple(str(node) for node in left) if isinstance(left, list) else None,
            left_count=int(state.get("nleft") or 0),
            load=functools.partial(self._roster, r),
        )

    def _wait_as_spare(self, r: int, size: int | None = None) -> int:
        """Round ``r`` has MAX nodes: wait, for as long as the job runs, until a round after it
        opens (a participant left or was lost); its number. A spare is not counted as a node
        waiting to join (round ``r`` has no room for it), so it starts no new round itself."""
        self.spare = True
        log.info(
            "rendezvous %r: waiting as a spare: the job has its %d nodes (round %d); this node takes the "
            "place of the first one to leave",
            self._run_id,
            self._max if size is None else size,
            r,
        )
        r_next = self._wait_late(r, math.inf, "", spare=True)
        self._spare_called = True
        log.info("rendezvous %r: this spare is called: round %d opened", self._run_id, r_next)
        return r_next

    def _wait_late(self, r: int, deadline: float, why: str, *, spare: bool = False) -> int:
        """Wait, counted as a waiting node of round ``r``, until round r + 1 opens; its number."""
        if not spare:
            log.info(
                "rendezvous %r: %s; this node waits for the next round",
                self._run_id,
                why,
            )
        checks = 0
        next_progress = time.monotonic() + self.progress_interval
        while True:
            now = time.monotonic()
            if self._ops.wait([self._keys.open(r + 1)], min(deadline, next_progress) - now):
                if self._ops.get(self._keys.open(r + 1)) == CLOSED:
                    raise self._closed_error()
                return r + 1
            now = time.monotonic()
            if now >= deadline:
                self._ops.add(self._keys.seq(r), -1)  # no longer waiting: do not trigger a restart
                raise RendezvousTimeoutError(
                    f"rendezvous {self._run_id!r} timed out after {self._config.join_timeout:g} s: "
                    f"{why}, and its nodes did not start a new round to admit this node"
                )
            next_progress = now + self.progress_interval
            self._raise_if_closed()
            current = self._read_current()
            if current > r:  # the opener died between moving "current" and writing "open"
                return current
            if spare:
                checks += 1
                if checks % 30 == 0:  # a spare may wait for the whole job: a reminder now and then
                    log.info("rendezvous %r: still waiting as a spare (round %d)", self._run_id, r)
                continue
            log.info(
                "rendezvous %r: still waiting for round %d to end and admit this node; timeout in %.0f s",
                self._run_id,
                r,
                max(0.0, deadline - now),
            )

    def _join_timed_out(self, r: int, index: int, deadline: float, previous: Membership | None, *,
                        closer: bool = False) -> Membership | int:
        count = self._ops.add(self._keys.seq(r), 0)
        whole = self._whole_at_timeout(r, count, closer) if self.segment is not None and count >= self._min else 0
        if count >= self._min and (self.segment is None or whole >= self._min):
            # MIN nodes are here: close now rather than fail (last call is only a courtesy).
            self._seal(r, count if self.segment is not None else min(count, self._max))
            return self._after_sealed(r, index, deadline)
        missing = self._missing(r, count, previous)
        aborted = {"state": "aborted", "reason": f"{self._node.id} timed out"}
        got = decode(self._ops.compare_set(self._keys.sealed(r), b"", encode(aborted)))
        if got.get("state") == "sealed" and isinstance(self._place(r, index, got).get("rank"), int):
            return self._after_sealed(r, index, deadline)  # sealed at the last moment, with this node
        if got.get("state") == "closed":
            raise self._closed_error()
        message = (
            f"rendezvous {self._run_id!r} timed out after {self._config.join_timeout:g} s: "
            f"{count} of {self._min} required nodes joined round {r} (--nnodes {self._min}:{self._max})"
        )
        if self.segment is not None and count >= self._min:  # (fewer: that is reason enough)
            message += (f", which make {whole // self.segment} whole segment(s) of {self.segment} nodes of one "
                        f"domain ({whole} nodes; --segment {self.segment} needs {self._min})")
        if missing:
            message += f"; missing since round {previous.round if previous else '?'}: {list_ids(missing)}"
        message += (
            ". Start the missing nodes, check that every node uses the same --rdzv-endpoint and "
            "--rdzv-id, or raise join_timeout"
        )
        raise RendezvousTimeoutError(message)

    # -- the job's end ---------------------------------------------------------------------------

    def is_closed(self) -> bool:
        """Whether some node closed the rendezvous (one ``check`` until it has)."""
        if not self.closed:
            self.closed = self._ops.check([self._keys.closed])
        return self.closed

    def _raise_if_closed(self) -> None:
        if self.is_closed():
            raise self._closed_error()

    def close_job(self, reason: str) -> None:
        """Close the rendezvous for every node, saying ``reason`` (``1``: none given); waiting and
        late nodes get RendezvousClosedError."""
        self._ops.set(self._keys.closed, reason.encode())
        raw = self._ops.compare_set(self._keys.current, b"", b"0")
        while raw != CLOSED:
            # Swap the round number for "closed" (retried only if a round opens meanwhile), so
            # that a node arriving later learns it from the read it does anyway.
            current = int(raw)
            raw = self._ops.compare_set(self._keys.current, raw, CLOSED)
            if raw == CLOSED:
                # Wake whoever waits for this round to close or for the next one to open.
                self._ops.compare_set(self._keys.sealed(current), b"", json.dumps({"state": "closed"}).encode())
                self._ops.set(self._keys.open(current + 1), CLOSED)
        self.closed = True
