"""The static rendezvous: a fixed set of nodes, each told its rank (``--node-rank``).

The node of rank 0 serves the store at ``--master-addr:--master-port`` (on loopback only when the
job has one node); the others connect to it. Each round is a barrier: every node waits until all
``nnodes`` have arrived at the same round, or fails after ``timeout`` seconds naming how many
arrived. Workers use the same store (``TORCHELASTIC_USE_AGENT_STORE=True``).

Who may use the store (docs/store-security.md): while the first round forms, whom the site's
``--rdzv-conf join_networks`` and ``secret_file`` allow (anyone when neither is set); every node
says at the barrier which address it reaches the store from, and once all have arrived rank 0
serves only those addresses, its own host and loopback, for the rest of the job. Workers'
torch clients are admitted by their host's address.
"""

from __future__ import annotations

import errno
import json
import logging
import time

from launcher.errors import UsageError
from launcher.rendezvous.api import (
    FixedMembership,
    RendezvousClosedError,
    RendezvousError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from launcher.rendezvous.config import store_admission
from launcher.rendezvous.endpoint import format_endpoint, parse_endpoint
from launcher.rendezvous.gate import member_addresses
from launcher.store.api import KeyValueStore, StoreError, StoreTimeoutError
from launcher.store.server import StoreServer

log = logging.getLogger("launcher.rendezvous")

DEFAULT_TIMEOUT = 600.0
CONFIG_KEYS = frozenset({"rank", "timeout", "join_networks", "secret_file"})


class StaticRendezvous(FixedMembership):
    """A :class:`~launcher.rendezvous.api.RendezvousHandler` for a fixed-size job."""

    def __init__(self, params: RendezvousParameters) -> None:
        if params.min_nodes != params.max_nodes:
            raise UsageError("the static rendezvous needs a fixed --nnodes; use c10d for MIN:MAX")
        self._params = params
        self._run_id = params.run_id
        self.world_size = params.max_nodes
        self.rank = params.get_as_int("rank", 0)
        self.timeout = params.get_as_float("timeout", DEFAULT_TIMEOUT)
        self.host, self.port = parse_endpoint(params.endpoint, 29500)
        self._admission = store_admission(params.config)
        self._restricted = False
        self._server: StoreServer | None = None
        self._store: KeyValueStore | None = None
        self._round = 0
        self._closed = False
        self._store_gone = False
        self._prefix = f"launcher/static/{params.run_id}"

    def _serve_or_connect(self) -> KeyValueStore:
        from launcher.store.client import TCPStoreClient

        if self.rank == 0:
            # One node: nothing but its own workers should reach the store.
            if self.world_size == 1:
                bind = "::1" if ":" in self.host else "127.0.0.1"
            else:
                bind = "::" if ":" in self.host else "0.0.0.0"
            server = StoreServer(bind, self.port)
            if self._admission is not None:
                server.admission = self._admission
            try:
                server.start()
            except (OSError, StoreError) as exc:
                cause = exc if isinstance(exc, OSError) else exc.__cause__
                if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
                    raise RendezvousError(
                        f"port {self.port} is already in use on this node (another job?): choose a free "
                        "--master-port, or use --standalone to get one automatically"
                    ) from None
                raise RendezvousError(f"cannot serve the store on {format_endpoint(bind, self.port)}: {exc}") from None
            self._server = server
            if self.world_size == 1:
                self.host = bind
            return TCPStoreClient(bind if bind not in ("0.0.0.0", "::") else "127.0.0.1", server.port,
                                  timeout=self.timeout)
        secret = self._admission.secret if self._admission is not None else None
        return TCPStoreClient(self.host, self.port, timeout=self.timeout, secret=secret)

    def next_rendezvous(self) -> RendezvousInfo:
        if self.is_closed():
            raise RendezvousClosedError(f"the rendezvous of run {self._params.run_id!r} is closed")
        if self._store is None:
            self._store = self._serve_or_connect()
        self._round += 1
        if self.world_size > 1:
            self._barrier(self._store, self._round)
        elif self._server is not None and self._round > 1:
            self._server.discard_keys(keep_prefixes=("launcher/",))
        port = self._server.port if self._server is not None else self.port
        return RendezvousInfo(
            store=self._store if self.world_size > 1 else None,
            group_rank=self.rank,
            group_world_size=self.world_size,
            master_addr=self.host,
            master_port=port,
            use_agent_store=True,
            round=self._round,
            participants=[],
        )

    def _barrier(self, store: KeyValueStore, round_: int) -> None:
        key = f"{self._prefix}/round{round_}"
        if round_ == 1:
            # Where this node reaches the store from: once every node has arrived, rank 0
            # serves only those addresses (and its own host).
            via = getattr(store, "local_address", None)
            addresses = [a for a in (self._params.local_addr, via) if a]
            store.set(f"{self._prefix}/addr/{self.rank}", json.dumps(addresses).encode())
        arrived = store.add(f"{key}/arrived", 1)
        if arrived == self.world_size:
            store.set(f"{key}/all_arrived", b"1")
        deadline = time.monotonic() + self.timeout
        if self._server is not None:
            # The node serving the store releases the round once every node's workers are
            # stopped, after clearing what the previous attempt's workers wrote.
            self._wait(store, f"{key}/all_arrived", round_, deadline)
            self._restrict(store)
            if round_ > 1:
                self._server.discard_keys(keep_prefixes=("launcher/",))
            store.set(f"{key}/complete", b"1")
        self._wait(store, f"{key}/complete", round_, deadline)

    def _restrict(self, store: KeyValueStore) -> None:
        """Rank 0, every node arrived: serve only the nodes' addresses from now on."""
        if self._restricted or self._server is None:
            return
        raw = store.multi_get([f"{self._prefix}/addr/{rank}" for rank in range(self.world_size)], self.timeout)
        entries = []
        for value in raw:
            try:
                entries.append([str(a) for a in json.loads(value)])
            except (ValueError, TypeError):
                entries.append([])
        members = member_addresses(entries, self._run_id, "the static rendezvous's store")
        if members is not None:
            self._server.restrict_to(members)
        self._restricted = True

    def _wait(self, store: KeyValueStore, done_key: str, round_: int, deadline: float) -> None:
        key = f"{self._prefix}/round{round_}"
        next_note = time.monotonic() + 30.0
        while True:
            try:
                # One-second slices: a node that ended the job meanwhile (closed it) must end
                # this wait too, say one that finished while this node failed and restarted.
                store.wait([done_key], timeout=min(1.0, max(0.1, deadline - time.monotonic())))
                return
            except StoreTimeoutError:
                if store.check([f"{self._prefix}/closed"]):
                    self._closed = True
                    raise RendezvousClosedError(
                        f"the rendezvous of run {self._params.run_id!r} was closed by another node") from None
                now = time.monotonic()
                if now < deadline and now < next_note:
                    continue
                next_note = now + 30.0
                count = store.add(f"{key}/arrived", 0)
                if now >= deadline:
                    raise RendezvousTimeoutError(
                        f"static rendezvous round {round_}: only {count} of {self.world_size} nodes arrived "
                        f"within {self.timeout:.0f}s (store {format_endpoint(self.host, self.port)})"
                    ) from None
                log.info("waiting for nodes: %d of %d arrived (round %d, %.0fs until timeout)",
                         count, self.world_size, round_, deadline - time.monotonic())

    def _shares_closing(self) -> bool:
        return self._store is not None and self.world_size > 1 and not self._store_gone

    def is_closed(self) -> bool:
        """Whether this node, or any other node of the job, closed it (a key in the shared store).

        Shared so that a node whose job failed tells the others at once: a node that finished
        and waits at the exit barrier leaves then, rather than after the barrier's timeout.
        Raises :class:`~launcher.store.api.StoreError` when the store does not answer (the
        agent then asks :meth:`store_problem` whether it is gone).
        """
        if not self._closed and self._store is not None and self._shares_closing():
            self._closed = self._store.check([f"{self._prefix}/closed"])
        return self._closed

    def set_closed(self) -> None:
        """End the job for every node (late arrivals exit instead of waiting)."""
        self._closed = True
        if self._store is not None and self._shares_closing():
            try:
                self._store.set(f"{self._prefix}/closed", b"1")
            except (StoreError, OSError) as exc:
                log.debug("static rendezvous: cannot tell the other nodes the job was closed: %s", exc)

    # -- StoreBackedHandler: telling a store that is gone from a slow one ---------------------

    def store_location(self) -> str:
        """``the rendezvous store on host:port (node 0)``, as messages name it."""
        return f"the rendezvous store on {format_endpoint(self.host, self.port)} (node 0)"

    def store_problem(self, timeout: float = 2.0) -> str | None:
        """Why node 0's store cannot be reached (a fresh connect fails), or ``None``."""
        if self._server is not None or self.world_size == 1:
            return None  # served here
        from launcher.store.connection import reachability_problem

        return reachability_problem(self.host, self.port, timeout)

    def abandon_store(self) -> None:
        """The store is gone: :meth:`set_closed` then writes nothing to it."""
        self._store_gone = True

    def node_address(self) -> str | None:
        """``--local-addr``, when given."""
        return self._params.local_addr

    def shutdown(self) -> bool:
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._server is not None:
            self._server.close()
            self._server = None
        return True

