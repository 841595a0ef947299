"""The single-node rendezvous: no peers, and a store the agent serves on loopback.

Used for ``--standalone`` and for any one-node c10d job on an ephemeral port. It never imports
torch: the workers' store is launcher's pure-Python TCPStore-compatible server, bound to port 0
on loopback so the kernel picks a free port and concurrent jobs can never collide.
"""

from __future__ import annotations

import socket

from launcher.rendezvous.api import FixedMembership, RendezvousClosedError, RendezvousInfo
from launcher.store.server import StoreServer


class LocalRendezvous(FixedMembership):
    """A :class:`~launcher.rendezvous.api.RendezvousHandler` for a job of exactly one node."""

    def __init__(self, run_id: str, host: str = "127.0.0.1") -> None:
        self._run_id = run_id
        self._host = host
        self._server: StoreServer | None = None
        self._round = 0
        self._closed = False

    def next_rendezvous(self) -> RendezvousInfo:
        if self._closed:
            raise RendezvousClosedError(f"the rendezvous of run {self._run_id!r} is closed")
        # A fresh store per round, as torchrun's agent gives: workers of a restarted group must
        # not find the keys (addresses of dead ranks) that the previous attempt wrote.
        if self._server is not None:
            self._server.close()
        self._server = StoreServer(self._host, 0)
        self._server.start()
        self._round += 1
        return RendezvousInfo(
            store=None,
            group_rank=0,
            group_world_size=1,
            master_addr=self._host,
            master_port=self._server.port,
            use_agent_store=True,
            round=self._round,
            participants=[socket.gethostname()],
        )

    def shutdown(self) -> bool:
        if self._server is not None:
            self._server.close()
            self._server = None
        return True
