"""The core's rendezvous handler: elastic membership over any key-value store.

Every node does a constant number of store operations per round, whatever the number of nodes:
an atomic ``add`` hands out join order, each node writes only its own keys, and one node, the
*closer*, writes a single ``sealed`` key that fixes the round's participants and their ranks. No
shared record is rewritten by compare-and-set in a loop, which is what makes torchrun's c10d
rendezvous slow down sharply with node count. Liveness is a ring: each participant writes a
heartbeat counter and watches the counter of the next participant only.

The protocol (rounds, keys, who closes a round, rank assignment, liveness, failure cases) is
written down in ``docs/rendezvous.md``; the comments here refer to it. This module is the
handler that the agent drives: it joins rounds, reports waiting and lost nodes, and leaves.
The parts it puts together, one module each: the key names (:mod:`~launcher.rendezvous.keys`),
the store connection (:mod:`~launcher.rendezvous.store_ops`), the records nodes store
(:mod:`~launcher.rendezvous.membership`), forming rounds (:mod:`~launcher.rendezvous.rounds`),
the heartbeat ring (:mod:`~launcher.rendezvous.liveness`) and the workers' store
(:mod:`~launcher.rendezvous.workers_store`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from launcher.rendezvous.api import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.departures import report_departure
from launcher.rendezvous.gate import StoreGate
from launcher.rendezvous.keys import KEY_ROOT, RendezvousKeys
from launcher.rendezvous.liveness import (
    LEFT,
    STOPPED_GRACE,
    HeartbeatScheduler,
    LostNodes,
    RingWatcher,
    await_departures,
    await_hangups,
    shared_scheduler,
)
from launcher.rendezvous.membership import Membership, NodeDescriptor
from launcher.rendezvous.rounds import Rounds
from launcher.rendezvous.store_ops import RoundStore, StoreOps, wait_slice_for
from launcher.rendezvous.workers_store import WorkersStore
from launcher.store.api import KeyValueStore, StoreError

__all__ = [
    "KEY_ROOT",
    "SPARE_TELL_S",
    "DynamicRendezvousHandler",
    "NodeDescriptor",
    "SpareNotNeeded",
    "handler_over_store",
]

log = logging.getLogger("launcher.rendezvous")

#: Seconds, at most, that the store's host serves on at the job's end for the spares that wait
#: (refused ones ask every second or so, see launcher.store.connection) to learn that it ended.
SPARE_TELL_S = 3.0


class SpareNotNeeded(RendezvousClosedError):
    """The job ended while this node only waited as a spare (it took part in no round): it was
    not needed, which is no failure of this node (the agent exits 0; see "Spares" in
    docs/rendezvous.md)."""


class DynamicRendezvousHandler:
    """A :class:`~launcher.rendezvous.api.RendezvousHandler` running the core's algorithm.

    ``store`` is any :class:`~launcher.store.api.KeyValueStore` every node of the job reaches;
    the handler owns it and closes it on :meth:`shutdown`. ``is_host`` says this node serves
    the store (it then goes first in rank order with ``stable_rank0``). ``master_addr`` and
    ``master_port`` name a store the workers use in every round; leave them ``None`` (the default)
    and the agent of group rank 0 serves a fresh store for each round's workers (launcher's
    pure-Python TCPStore on a kernel-chosen port) and publishes its address: torch's workers add
    no per-attempt prefix to an agent store, so a store shared across rounds would hand a
    re-formed group the addresses of the previous group's dead ranks. ``local_world_size``
    (settable before each round) is shared with the other nodes and comes back in
    ``RendezvousInfo.local_world_sizes``.
    ``progress_interval`` is the period of "still waiting" messages on the
    ``launcher.rendezvous`` logger. ``on_shutdown`` runs once in :meth:`shutdown` (the c10d
    host stops its store server there). ``store_address`` (``host:port``) names the store in
    messages and lets :meth:`store_problem` probe it. ``heartbeats`` steps this node's
    heartbeat ring (``None``: the process's shared scheduler). ``store_server`` is the
    :class:`~launcher.store.server.StoreServer` this node serves the store with (c10d's host):
    once a round is closed it serves only the round's participants (and whoever proves the
    configured secret), see docs/store-security.md.

    A node that serves the store (``is_host``) keeps serving in :meth:`shutdown` until every
    other participant of its last round has left (or is lost, or ``close_timeout`` passes),
    however its job ended: see "Leaving" in docs/rendezvous.md.
    """

    def __init__(
        self,
        store: KeyValueStore,
        *,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        config: DynamicRendezvousConfig | None = None,
        local_addr: str | None = None,
        is_host: bool = False,
        master_addr: str | None = None,
        master_port: int | None = None,
        local_world_size: int | None = None,
        backend_name: str = "dynamic",
        progress_interval: float = 10.0,
        on_shutdown: Callable[[], None] | None = None,
        store_address: str | None = None,
        heartbeats: HeartbeatScheduler | None = None,
        store_server: Any = None,
    ) -> None:
        if not run_id:
            raise RendezvousError("the rendezvous needs a non-empty run id (--rdzv-id)")
        if not 1 <= min_nodes <= max_nodes:
            raise RendezvousError(f"--nnodes {min_nodes}:{max_nodes} is invalid: need 1 <= MIN <= MAX")
        self._config = config or DynamicRendezvousConfig()
        self._run_id = run_id
        self._min, self._max = min_nodes, max_nodes
        self._node = NodeDescriptor.generate(local_addr)
        self._is_host = is_host
        self.local_world_size = local_world_size
        #: ``--topology``: this node's location (a :class:`~launcher.topology.api.NodeLocation`),
        #: written in its join record so that the closer orders the round by path; ``None``: off.
        self.topology: Any = None
        #: ``--segment N``: only whole segments of N nodes of one domain (the whole path) take
        #: part; the others wait as spares (docs/topology.md). ``None``: off.
        self.segment: int | None = None
        self._backend_name = backend_name
        self._on_shutdown = on_shutdown
        self._store_address = store_address
        self._store_gone = False
        #: Spares waiting beyond this node's round (a round at MAX: every node late for it), as the
        #: last :meth:`num_nodes_waiting` read it (no store read of its own: the status publisher
        #: exports it as ``launcher_spares_waiting``); ``None`` before the first such read.
        self.spares_waiting: int | None = None
        #: Why this node's last next_rendezvous failed (shared by set_closed).
        self._failure: str | None = None
        self._keys = RendezvousKeys(run_id)
        self._ops = StoreOps(store, run_id, self._config.read_timeout)
        self._ops.wait_slice = wait_slice_for(
            max_nodes, self._config.keep_alive_interval, self._config.liveness_timeout
        )
        self._rounds = Rounds(
            self._ops,
            self._keys,
            self._node,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            config=self._config,
            progress_interval=progress_interval,
        )
        self._server = store_server
        self._gate = (
            StoreGate(store_server, self._config.store_admission, run_id) if store_server is not None else None
        )
        if self._gate is not None:
            self._rounds.on_attempt = self._gate.round_opened
            self._rounds.on_sealed = self._gate.round_sealed
        if store_server is not None:
            # An agent whose process dies is reported when its connection closes, at once.
            from launcher.rendezvous.disconnects import ClosedConnections

            ClosedConnections(store_server, run_id, self._config.read_timeout,
                              unreachable_after=self._config.liveness_timeout).start()
        self._heartbeats = heartbeats
        self._current: Membership | None = None
        #: This node's last round, kept after it left it (the host waits for its departures).
        self._last: Membership | None = None
        self._was_rank0 = False
        self._watcher: RingWatcher | None = None
        self._lost = LostNodes()
        #: Why the nodes of earlier rounds departed (this round's are in ``_lost``).
        self._reasons: dict[str, str] = {}
        self._shut_down = False
        #: Set by :meth:`depart`: this node is being stopped.
        self._stopping = False
        #: Whether this node's agent is being stopped (a signal): the host then serves the
        #: others' departure for seconds, not ``close_timeout`` (the agent sets it).
        self.stop_requested: Callable[[], bool] = lambda: False
        self._workers = WorkersStore(self._ops, self._keys, self._node.addr, master_addr, master_port)

    @classmethod
    def from_parameters(
        cls, store: KeyValueStore, params: RendezvousParameters, config: DynamicRendezvousConfig, **options: Any
    ) -> DynamicRendezvousHandler:
        """A handler over ``store`` for the job ``params`` names (run id, ``--nnodes``, local
        address). ``options`` go to the constructor; ``backend_name`` defaults to ``params.backend``."""
        options.setdefault("backend_name", params.backend)
        return cls(
            store,
            run_id=params.run_id,
            min_nodes=params.min_nodes,
            max_nodes=params.max_nodes,
            config=config,
            local_addr=params.local_addr,
            **options,
        )

    # -- facts -------------------------------------------------------------------------------

    @property
    def node(self) -> NodeDescriptor:
        """This node's descriptor (its ``id`` appears in ``participants``)."""
        return self._node

    @property
    def config(self) -> DynamicRendezvousConfig:
        """The validated settings."""
        return self._config

    def get_backend(self) -> str:
        """The backend name (``c10d``, or the store plugin's name)."""
        return self._backend_name

    def get_run_id(self) -> str:
        """The job id all nodes share."""
        return self._run_id

    @property
    def progress_interval(self) -> float:
        """Seconds between "still waiting" messages on the ``launcher.rendezvous`` logger."""
        return self._rounds.progress_interval

    @progress_interval.setter
    def progress_interval(self, seconds: float) -> None:
        self._rounds.progress_interval = seconds

    # -- joining -----------------------------------------------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and return this node's place in it.

        Raises :class:`RendezvousClosedError` when the job is over, and
        :class:`RendezvousTimeoutError` when fewer than MIN nodes joined within ``join_timeout``.
        """
        if self._shut_down:
            raise RendezvousError(f"rendezvous {self._run_id!r}: this handler was shut down")
        deadline = time.monotonic() + self._config.join_timeout
        previous = self._current
        self._leave(rejoin=True)
        record = self._node.record(
            is_host=self._is_host,
            was_rank0=self._was_rank0,
            local_world_size=self.local_world_size,
            via=_local_address(self._ops.store),
            topo=self._topology_record(),
        )
        if self.segment is not None and self._rounds.segment is None:
            from launcher.topology.segments import domain_number

            self._rounds.segment = self.segment
            self._rounds.domain = domain_number(self.topology.path) if self.topology is not None else None
        try:
            membership = self._rounds.join(previous, record, deadline)
        except RendezvousTimeoutError as exc:
            self._failure = str(exc)
            raise
        except RendezvousClosedError as exc:
            if self._rounds.spare and self._last is None and not isinstance(exc, SpareNotNeeded):
                raise SpareNotNeeded(f"{exc}; this node only waited as a spare, and was not needed") from None
            raise
        self._current = self._last = membership
        self._was_rank0 = membership.rank == 0
        if previous is not None and previous.size > 1:
            # Why the previous round's missing nodes went, for the agent's "left the job" line.
            with contextlib.suppress(RendezvousError, StoreError):  # a courtesy: the round is formed
                self._lost.read(self._ops, self._keys, previous.round)
        elif previous is None and membership.round > 0:
            # A first join into a later round (a spare called in): the nodes of the round before
            # that it takes the place of, and why they went (a straggler put out, say).
            with contextlib.suppress(RendezvousError, StoreError):
                self._lost.read(self._ops, self._keys, membership.round - 1)
        self._reasons.update(self._lost.reasons())
        self._lost.reset()
        if membership.size > 1:
            scheduler = self._heartbeats or shared_scheduler()
            self._watcher = RingWatcher(self._ops, self._keys, membership, self._config, self._lost.record, scheduler)
            self._watcher.start()
        master_addr, master_port = self._workers.locate(membership)
        log.info(
            "rendezvous %r: round %d formed with %d nodes; this node %s is group rank %d%s",
            self._run_id,
            membership.round,
            membership.size,
            self._node.id,
            membership.rank,
            f" at {self.topology}" if self.topology is not None else "",
        )
        return RendezvousInfo(
            store=RoundStore(self._ops, self._keys.agent(membership.round)),
            group_rank=membership.rank,
            group_world_size=membership.size,
            master_addr=master_addr,
            master_port=master_port,
            use_agent_store=True,
            round=membership.round,
            # Both read from the store on first use (this node's own id needs no read): see
            # "What a node reads" in docs/rendezvous.md.
            participants=membership.ids,
            # Only meaningful when every node said how many workers it runs.
            local_world_sizes=cast("Sequence[int]", membership.local_world_sizes)
            if membership.world_size is not None
            else [],
            left=membership.left,
            left_count=membership.left_count,
        )

    def _topology_record(self) -> dict[str, Any] | None:
        """This node's location as its join record carries it (``None`` without ``--topology``)."""
        if self.topology is None:
            return None
        from launcher.topology.order import location_record

        return location_record(self.topology.path, self.topology.order)

    # -- while the workers run ---------------------------------------------------------------

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join a new round: restarts asked by participants, plus late nodes
        while the round has room for them (two store reads). The node that serves the store
        first announces, as late nodes, the agents it refused lately only because the round is
        closed (see :class:`~launcher.rendezvous.gate.StoreGate`)."""
        m = self._current
        if m is None or self._shut_down:
            return 0
        # On the store's host, an agent refused because the round is closed is announced as a
        # late node of the round, so that every participant sees it waiting at once.
        joiners = self._gate.new_joiners() if self._gate is not None else 0
        late = max(0, self._ops.add(self._keys.seq(m.round), joiners) - m.count)
        rejoin = self._ops.add(self._keys.rejoin(m.round), 0)
        # With --segment a round grows only when it re-forms: a node left out of it waits as a
        # spare (it has no whole segment to train in), and does not make the others restart.
        room = max(0, self._max - m.size) if self.segment is None else 0
        self.spares_waiting = max(0, late - room)  # beyond the room: they wait for a node to leave
        return rejoin + min(late, room)

    def lost_nodes(self) -> list[str]:
        """Participants of this round whose heartbeat is older than the liveness timeout.

        One store read per call while nothing is lost.
        """
        m = self._current
        if m is None or m.size == 1 or self._shut_down:
            return []
        return self._lost.read(self._ops, self._keys, m.round)

    def departures(self) -> dict[str, str]:
        """Why each node :meth:`lost_nodes` has named so far is gone (``agent process died``,
        ``heartbeat timeout``...), for the nodes whose report says (see
        :mod:`~launcher.rendezvous.departures`), in this round and the earlier ones."""
        return {**self._reasons, **self._lost.reasons()}

    def put_out(self, node_id: str, reason: str, *, publish: bool = True) -> str | None:
        """Put ``node_id`` out of this round because of ``reason`` (a straggler, say), through the
        one re-forming path (:func:`~launcher.rendezvous.departures.report_departure`): every
        participant re-forms without it, and a waiting spare takes its place. Only when the job
        can do without it: a spare waits, or the round has more than MIN nodes; never the node
        that serves the store. With ``--segment``, a spare counts only where it keeps MIN nodes
        in whole segments of one domain: a spare of the node's own domain, or spares that make
        whole segments elsewhere (:meth:`_segments_without`). ``None`` once published
        (``publish`` false: would be); else why not."""
        m = self._current
        # This node's own id needs no read of the round's participants list (a node that
        # leaves); another node's does (a straggler put out: one node, once).
        if m is None or self._shut_down or (node_id != m.node_id and node_id not in m.ids):
            return "it is not in this node's round"
        if node_id in self._lost.read(self._ops, self._keys, m.round):
            return None  # already out (another node's report): nothing to refuse
        refused = self._cannot_do_without(m, node_id)
        if refused is None and publish:
            self._publish_departure(m, node_id, reason)
        return refused

    def _publish_departure(self, m: Membership, node_id: str, reason: str) -> None:
        """Report ``node_id`` gone from round ``m`` (every participant re-forms without it)."""
        report_departure(self._ops, self._keys, m.round, node_id, reason)
        self._lost.record(node_id, reason)

    def _cannot_do_without(self, m: Membership, node_id: str) -> str | None:
        """Why round ``m`` cannot go on without ``node_id`` (``None``: it can)."""
        if m.host_rank is not None and m.ids[m.host_rank] == node_id:
            return "it serves the rendezvous store, which the other nodes cannot do without"
        if self.segment is not None:
            return self._segments_without(m, node_id, self.segment)
        if m.size <= self._min and self._ops.add(self._keys.seq(m.round), 0) <= m.count:
            return f"the job would fall below its {self._min} nodes minimum and no spare waits"
        return None

    def _segments_without(self, m: Membership, node_id: str, size: int) -> str | None:
        """``--segment``: why a re-form of round ``m`` without ``node_id`` could not hold MIN nodes
        in whole segments of one domain (``None``: it could).

        The node's own segment loses a node; a spare of its domain fills it, else the segment
        drops out (its survivors wait as spares) unless the other spares complete whole segments
        (the closer's choice, :func:`~launcher.topology.segments.select_segments`). A spare of
        another domain that completes none is no replacement: putting the node out would leave
        the job waiting for nodes instead of training. O(1) reads while a whole segment fewer
        still holds MIN nodes or no spare waits; else one read per waiting spare (its record, for
        its domain; one refused by the store before it could write one has no known domain and
        is not counted)."""
        if m.size - size >= self._min:
            return None  # a whole segment fewer still holds MIN nodes
        joined = self._ops.add(self._keys.seq(m.round), 0)
        if joined <= m.count:
            return f"the job would fall below its {self._min} nodes minimum and no spare waits"
        from collections import Counter

        from launcher.rendezvous.membership import decode
        from launcher.topology.order import record_path

        gone = set(self._lost.read(self._ops, self._keys, m.round)) | {node_id}
        ids, paths = list(m.ids), m.paths
        domains = Counter(path for node, path in zip(ids, paths, strict=False) if path and node not in gone)
        taken = set(m.indexes)
        spares = 0
        for index in range(1, joined + 1):
            key = self._keys.node(m.round, index)
            if index in taken or not self._ops.check([key]):
                continue
            path = record_path(decode(self._ops.get(key)))
            if path is not None:
                domains[".".join(path)] += 1
                spares += 1
        if sum(count // size for count in domains.values()) * size >= self._min:
            return None
        own = paths[ids.index(node_id)] if node_id in ids and ids.index(node_id) < len(paths) else None
        return (f"the job would fall below its {self._min} nodes minimum: --segment {size} needs a spare of its "
                f"domain {own or '(unknown)'}, and the {spares} spare(s) waiting with a known domain make no "
                "whole segment")

    def death_notice(self) -> list[str] | None:
        """A command that, run once this node's agent died, reports this node gone from its round
        at once (its watchdog runs it: ``launcher.containment.watchdog``); ``None`` when the store sees
        a death by itself (c10d: the connection closes, ``launcher.rendezvous.disconnects``) or
        this node is alone. The store offers it (``death_notice(run_id, round, node, rank)``)."""
        m = self._current
        notice = getattr(self._ops.store, "death_notice", None)
        if m is None or m.size == 1 or not callable(notice):
            return None
        argv = notice(self._run_id, m.round, self._node.id, m.rank)
        return list(argv) if argv else None

    # -- launcher.health (issue 26): the store before this node joins any round --------------

    def shared_store(self, prefix: str) -> RoundStore:
        """The rendezvous store, keys under ``prefix`` (outside the rendezvous's own keys),
        usable before this node joins a round: a node a health check keeps out leaves its record
        there (:mod:`launcher.health.board`)."""
        return RoundStore(self._ops, prefix)

    # -- ending ------------------------------------------------------------------------------

    def is_closed(self) -> bool:
        """Whether some node closed the rendezvous (the job is over)."""
        if self._shut_down:
            return self._rounds.closed
        return self._rounds.is_closed()

    def set_closed(self) -> None:
        """Close the rendezvous for every node; waiting and late nodes get RendezvousClosedError."""
        # A node that ends the job because its own rendezvous failed says why, so that the nodes
        # it stops can name the cause (a lost node, say) instead of only "closed".
        if self._rounds.spare and self._last is None:
            # A spare has no part in the job: its own failure (a store that kept it out too
            # long, say) must not end the job of the nodes it was waiting to replace.
            log.warning("rendezvous %r: this node only waited as a spare: the job goes on without it", self._run_id)
            return
        reason = f"{self._node.id}: {self._failure}" if self._failure else "1"
        self._rounds.close_job(reason)
        self._end_job()

    def _end_job(self) -> None:
        """On the store's host: the job is over, so refused spares asking are told it ended."""
        end = getattr(self._server, "end_job", None)
        if callable(end):
            end()

    def _tell_spares(self) -> None:
        """On the store's host, at the job's end: serve for up to :data:`SPARE_TELL_S` more while
        spares wait to learn it (refused ones that asked lately, and ones inside the store, which
        read the closed rendezvous and hang up), so that none takes the store's going for a loss."""
        server = self._server
        untold = getattr(server, "untold_spares", None)
        inside = getattr(server, "outside_clients", None)
        if not callable(untold) or not callable(inside):
            return
        try:
            if not self._rounds.is_closed():
                return  # not ended: its store going is news the spares must not take for an end
        except (RendezvousError, StoreError):
            return
        self._end_job()
        deadline = time.monotonic() + SPARE_TELL_S
        waited = False
        while (untold() or inside()) and time.monotonic() < deadline and not self._stopped():
            if not waited:
                waited = True
                log.info("rendezvous %r: serving the store up to %g s more for the spares to learn the job ended",
                         self._run_id, SPARE_TELL_S)
            time.sleep(0.05)

    def depart(self, reason: str) -> bool:
        """This node is being stopped (``stopped by SIGTERM``): tell the others before it goes.

        Its departure is published with ``reason`` (:mod:`~launcher.rendezvous.departures`), as
        when a node is lost: when the job can do without it (a spare waits, or the round has more
        than MIN nodes; never the node that serves the store) the others re-form without it, and
        ``True`` is returned; otherwise the job is closed for every node, naming this node and
        ``reason``, and ``False`` is returned. A node in no round (waiting to join one) closes the
        job the same way, unless it only waited as a spare. Raises what the store raises."""
        self._stopping = True
        m = self._current
        # Asked first, not only when no report says this node is out: it may be "out" already by
        # a report of its own connection closing (a signal that cut a store call short drops the
        # connection, launcher.store.client), and that report alone would let the others run on
        # without it below MIN, or, once it had finished, treat it as done rather than stopped.
        if (m is not None and m.size > 1 and not self._shut_down
                and self._cannot_do_without(m, self._node.id) is None):
            if self._node.id not in self._lost.read(self._ops, self._keys, m.round):
                self._publish_departure(m, self._node.id, reason)
            log.warning("rendezvous %r: this node leaves the job (%s); the others re-form without it",
                        self._run_id, reason)
            return True
        self._failure = reason
        self.set_closed()  # first: the others end at their next check (a departure alone would re-form)
        if m is not None and m.size > 1:
            report_departure(self._ops, self._keys, m.round, self._node.id, reason)
        return False

    def _leave(self, *, rejoin: bool) -> None:
        """Stop heartbeats and tell the round's other nodes that this node left on purpose."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        m, self._current = self._current, None
        if m is None:
            return
        try:
            self._ops.add(self._keys.heartbeat(m.round, m.rank), LEFT)
            if rejoin:
                self._ops.add(self._keys.rejoin(m.round), 1)
        except (RendezvousError, StoreError) as exc:
            log.warning("rendezvous %r: could not announce leaving round %d: %s", self._run_id, m.round, exc)

    def node_address(self) -> str | None:
        """The address this node announced to the others."""
        return self._node.addr

    def abandon_store(self) -> None:
        """The store is gone (its host died): :meth:`shutdown` then writes nothing to it."""
        self._store_gone = True

    def store_location(self) -> str:
        """``the rendezvous store on host:port (node N)``, as messages name it."""
        where = f" on {self._store_address}" if self._store_address else ""
        m = self._current
        node = f" (node {m.host_rank})" if m is not None and m.host_rank is not None else ""
        return f"the rendezvous store{where}{node}"

    def store_problem(self, timeout: float = 2.0) -> str | None:
        """Why the store cannot be reached (a fresh TCP connect to it fails), or ``None``.

        Asked after a store call failed: tells a store that is gone (refused: nothing listens
        any more) or cut off (no answer) from a passing hiccup.
        """
        if not self._store_address:
            return None
        from launcher.rendezvous.endpoint import parse_endpoint
        from launcher.store.connection import reachability_problem

        host, port = parse_endpoint(self._store_address, 0)
        return reachability_problem(host, port, timeout)

    def _stopped(self) -> bool:
        if self._stopping:
            return True
        try:
            return bool(self.stop_requested())
        except Exception:  # a hook of the agent's: never a reason to serve on or to raise
            return False

    def shutdown(self) -> bool:
        """Leave the round, close the store (and stop serving it, on the host).

        Leaving is this node's last write to the store. The host first waits for the others to
        leave (or be reported lost, or ``close_timeout`` to pass), so nobody's last write meets a
        closed store; also when this node is in no round any more (its last rendezvous failed),
        for the participants of its last round.
        """
        if self._shut_down:
            return True
        ok = True
        if self._store_gone:
            if self._watcher is not None:
                self._watcher.stop(wait=False)  # a beat in flight to a store that is gone only fails
                self._watcher = None
            self._current = None
        elif self._is_host and self._current is not None:
            # Serve until the others have left (see "Leaving"), heartbeating meanwhile so
            # that their watchers do not report this node lost.
            await_departures(self._ops, self._keys, self._current, self.lost_nodes, self._config.close_timeout,
                             self._stopped)
        elif self._is_host and self._last is not None and self._last.size > 1:
            # This node left its last round and found no new one (a failed rendezvous): a node
            # of that round may still be at its exit barrier, or reporting; serve it until it left.
            last, reports = self._last, LostNodes()
            await_departures(
                self._ops,
                self._keys,
                last,
                lambda: reports.read(self._ops, self._keys, last.round),
                self._config.close_timeout,
                self._stopped,
            )
        elif self._is_host and self._server is not None and self._stopped():
            # Stopped while in no round (waiting to join one): the nodes waiting with it learn
            # the job is closed from the store; serve it until they hung up (seconds at most).
            await_hangups(self._server, STOPPED_GRACE)
        if self._is_host and self._server is not None and not self._store_gone:
            self._tell_spares()
        try:
            self._leave(rejoin=False)
        except Exception as exc:  # shutting down must not raise
            log.warning("rendezvous %r: shutdown: %s", self._run_id, exc)
            ok = False
        self._shut_down = True
        self._workers.stop()
        try:
            self._ops.store.close()
        finally:
            callback, self._on_shutdown = self._on_shutdown, None
            if callback is not None:
                callback()
        return ok


def _local_address(store: KeyValueStore) -> str | None:
    """The address ``store``'s connection comes from, when it is a socket client that says."""
    try:
        value = getattr(store, "local_address", None)
    except Exception:  # a wrapper's attribute lookup must not break joining
        return None
    return value if isinstance(value, str) and value else None


def handler_over_store(
    store: KeyValueStore,
    params: RendezvousParameters,
    *,
    known_keys: Iterable[str] | None = None,
    **options: Any,
) -> DynamicRendezvousHandler:
    """The core's rendezvous over a store plugin's ``store`` (a ``create_store`` backend).

    ``known_keys`` lists the ``--rdzv-conf`` keys allowed (``None``: do not check, the plugin's
    own keys share the mapping). ``options`` go to :class:`DynamicRendezvousHandler`.
    """
    config = DynamicRendezvousConfig.from_parameters(params, known=known_keys)
    return DynamicRendezvousHandler.from_parameters(store, params, config, **options)
