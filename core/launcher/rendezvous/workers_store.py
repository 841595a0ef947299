"""The workers' store of each round: group rank 0's agent serves it, every node learns where.

torch's workers add no per-attempt prefix to an agent store, so a store shared across rounds
would hand a re-formed group the addresses of the previous group's dead ranks. Unless the
backend names a fixed store, group rank 0 therefore serves a fresh
:class:`~launcher.store.server.StoreServer` for each round, on a kernel-chosen port, and
publishes its address under ``<r>/master`` (see "Keys" in docs/rendezvous.md). The round is
closed by then, so that store serves only the round's participants' addresses, this host and
loopback from the start: torch's worker clients are admitted by address (docs/store-security.md).
"""

from __future__ import annotations

import json
from typing import Any

from launcher.rendezvous.gate import member_addresses
from launcher.rendezvous.keys import RendezvousKeys
from launcher.rendezvous.membership import Membership
from launcher.rendezvous.store_ops import StoreOps

__all__ = ["WorkersStore"]


class WorkersStore:
    """Where the workers of this node's rounds find their store.

    ``addr`` is this node's address (served on, when it is group rank 0). ``master_addr`` and
    ``master_port``, when both given, name one store for every round instead.
    """

    def __init__(
        self,
        ops: StoreOps,
        keys: RendezvousKeys,
        addr: str,
        master_addr: str | None = None,
        master_port: int | None = None,
    ) -> None:
        self._ops = ops
        self._keys = keys
        self._addr = addr
        self._master_addr = master_addr
        self._master_port = master_port
        self._server: Any = None

    def locate(self, m: Membership) -> tuple[str, int]:
        """``(addr, port)`` of round ``m``'s workers' store, serving it on group rank 0."""
        if self._master_addr is not None and self._master_port is not None:
            return self._master_addr, self._master_port
        key = self._keys.master(m.round)
        self.stop()  # last round's workers are gone; so is this node's role
        if m.rank == 0:
            from launcher.store.server import StoreServer

            addr = self._addr
            server = StoreServer("::" if ":" in addr else "0.0.0.0", 0)
            members = member_addresses(m.addresses, self._ops.run_id, "the workers' store") if m.addresses else None
            if members is not None:
                server.restrict_to(members)
            server.start()
            self._server = server
            self._ops.set(key, json.dumps([addr, server.port]).encode())
            return addr, server.port
        addr, port = json.loads(self._ops.get(key))
        return str(addr), int(port)

    def stop(self) -> None:
        """Stop serving, if this node serves."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
