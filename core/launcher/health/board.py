"""The records excluded nodes leave in the rendezvous store, and reading them.

A node that fails a health check joins no round, so the others cannot see it in a round's
records. Instead it leaves one record in the rendezvous store, outside the rendezvous's own keys
(``launcher/health/<quoted run id>/excluded/<n>``): it takes ``n`` from an atomic counter, then
writes ``{"node", "addr", "check", "reason"}`` as JSON. Healthy nodes read the counter (one
store operation) at each membership check and at the end of the job, and fetch only the records
they have not seen. The keys match no rendezvous key (:func:`launcher.rendezvous.keys.parse_key`
answers ``None``), so a store backend keeps them for the job's life, not a node's lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote

__all__ = ["ExcludedNode", "ExclusionBoard", "HealthBoardHandler", "board_of"]


@dataclass(frozen=True)
class ExcludedNode:
    """A node a health check kept out: its host name, address, the check and the reason."""

    node: str
    addr: str | None
    check: str
    reason: str

    @property
    def label(self) -> str:
        """``host (10.0.0.3)``."""
        return f"{self.node} ({self.addr})" if self.addr and self.addr != self.node else self.node

    def describe(self) -> str:
        """``host (10.0.0.3): health check 'command' failed: reason``."""
        return f"{self.label}: health check {self.check!r} failed: {self.reason}"

    def encode(self) -> bytes:
        import json

        return json.dumps({"node": self.node, "addr": self.addr, "check": self.check, "reason": self.reason},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ExcludedNode | None:
        import json

        try:
            data = json.loads(raw)
            return cls(str(data["node"]), data.get("addr"), str(data["check"]), str(data["reason"]))
        except (ValueError, KeyError, TypeError):
            return None


class _Store(Protocol):
    def set(self, key: str, value: bytes) -> None: ...
    def get(self, key: str, timeout: float | None = None) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...


@runtime_checkable
class HealthBoardHandler(Protocol):
    """A rendezvous handler that lends its store before this node joins a round (the core's
    dynamic rendezvous: c10d, etcd and every store backend)."""

    def shared_store(self, prefix: str) -> Any:
        """The rendezvous store, keys under ``prefix``."""
        ...


class ExclusionBoard:
    """The excluded-node records of one job in ``store`` (keys relative to the job's prefix)."""

    def __init__(self, store: _Store) -> None:
        self._store = store
        self._read = 0
        #: Every record read so far, in the order nodes wrote them.
        self.seen: list[ExcludedNode] = []

    @staticmethod
    def prefix(run_id: str) -> str:
        """Where the records of job ``run_id`` live."""
        return f"launcher/health/{quote(run_id, safe='')}/"

    def post(self, record: ExcludedNode) -> None:
        """Leave ``record`` (two store operations)."""
        index = self._store.add("excluded", 1)
        self._store.set(f"excluded/{index}", record.encode())

    def read_new(self) -> list[ExcludedNode]:
        """Records written since the last call (one store operation when there are none)."""
        count = self._store.add("excluded", 0)
        new = []
        while self._read < count:
            key = f"excluded/{self._read + 1}"
            if not self._store.check([key]):
                break  # taken its number, not written yet: read at the next call
            record = ExcludedNode.decode(self._store.get(key))
            self._read += 1
            if record is not None:
                new.append(record)
        self.seen += new
        return new


def board_of(handler: object, run_id: str) -> ExclusionBoard | None:
    """The board of ``handler``'s job, or ``None`` for a handler that lends no store (static,
    single-node, torch's own handlers: there the sick node's own line is all)."""
    if not isinstance(handler, HealthBoardHandler):
        return None
    return ExclusionBoard(handler.shared_store(ExclusionBoard.prefix(run_id)))
