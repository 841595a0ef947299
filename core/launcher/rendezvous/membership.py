"""Who takes part in a round: node descriptors, the records nodes store, a node's membership.

The values under the ``node/<i>`` and ``sealed`` keys (their layout is in "Keys" in
docs/rendezvous.md) are JSON objects; :func:`decode` reads them back, and :class:`Membership`
is what a node keeps of a sealed round it takes part in.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.rendezvous.api import RendezvousError

__all__ = [
    "COMPRESS_OVER",
    "Membership",
    "NodeDescriptor",
    "decode",
    "encode",
    "encode_large",
    "list_ids",
    "sealed_addresses",
]

# Node ids shown in one progress or error message, at most.
_MAX_IDS = 16

_local_ids = itertools.count()


@dataclass(frozen=True, order=True)
class NodeDescriptor:
    """Who a node is: its address, process id and a per-process counter.

    ``id`` (``addr_pid_n``) names the node in participants lists, logs and errors.
    """

    addr: str
    pid: int
    local_id: int

    @property
    def id(self) -> str:
        """``addr_pid_n``."""
        return f"{self.addr}_{self.pid}_{self.local_id}"

    @classmethod
    def generate(cls, local_addr: str | None = None) -> NodeDescriptor:
        """A descriptor unique to this handler: several handlers in one process never share one."""
        return cls(local_addr or socket.getfqdn(), os.getpid(), next(_local_ids))

    def record(
        self, *, is_host: bool, was_rank0: bool, local_world_size: int | None, via: str | None = None
    ) -> bytes:
        """The participant record this node writes under ``<r>/node/<i>``; ``via`` is the
        address its store connection comes from (what the store's host sees), when known."""
        value: dict[str, Any] = {
            "id": self.id,
            "addr": self.addr,
            "pid": self.pid,
            "lid": self.local_id,
            "host": is_host,
            "r0": was_rank0,
            "lws": local_world_size,
        }
        if via and via != self.addr:
            value["via"] = via
        return encode(value)


@dataclass(frozen=True)
class Membership:
    """This node's place in a sealed round."""

    round: int
    rank: int
    ids: list[str]
    local_world_sizes: list[int | None]
    #: Join indexes 1..count were considered by the closer; later ones are waiting.
    count: int
    #: Group rank of the participant that serves the store, if one does.
    host_rank: int | None = None
    #: The round's ``sealed`` record, as read (empty: not known); :attr:`addresses` comes from it.
    sealed: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @functools.cached_property
    def addresses(self) -> tuple[tuple[str, ...], ...]:
        """Each participant's addresses, in group-rank order: its announced address, then the one
        its store connection came from when that differs (empty when the round's record is not
        known). Worked out when first asked (by the nodes that serve a store: group rank 0 and
        the rendezvous's host), not by every node of a large round."""
        return sealed_addresses(self.sealed) if self.sealed else ()


#: A record longer than this (bytes of JSON) is stored zlib-compressed by :func:`encode_large`:
#: a large round's ``sealed`` record, which every node reads (about 90 bytes per node).
COMPRESS_OVER = 64 << 10
#: The first byte of a zlib stream (deflate, 32 KiB window); no JSON text starts with it.
_ZLIB_FIRST = 0x78


def encode(value: Any) -> bytes:
    """``value`` as the compact JSON every record is stored as."""
    return json.dumps(value, separators=(",", ":")).encode()


def encode_large(value: Any) -> bytes:
    """``value`` as :func:`encode` writes it, zlib-compressed when longer than
    :data:`COMPRESS_OVER`: each node of a round reads its ``sealed`` record, so the store's host
    sends it once per node (4,096 nodes: 4,096 times about 360 KB, or 50 KB compressed)."""
    raw = encode(value)
    if len(raw) <= COMPRESS_OVER:
        return raw
    import zlib

    return zlib.compress(raw, 1)


def decode(raw: bytes) -> dict[str, Any]:
    """A stored record (a JSON object, or one :func:`encode_large` compressed);
    :class:`RendezvousError` if it is anything else."""
    if raw[:1] == bytes([_ZLIB_FIRST]):
        import zlib

        with contextlib.suppress(zlib.error):  # reported below as unreadable
            raw = zlib.decompress(raw)
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RendezvousError(f"the rendezvous store holds a value this launcher cannot read: {raw[:80]!r}")
    return value


def list_ids(ids: Sequence[str]) -> str:
    """Node ids for a message: comma-separated, at most 16, then how many more."""
    shown = ", ".join(ids[:_MAX_IDS])
    if len(ids) > _MAX_IDS:
        shown += f" and {len(ids) - _MAX_IDS} more"
    return shown


def sealed_addresses(state: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """The participants' addresses of a ``sealed`` record, in group-rank order.

    From its ``addrs`` list; a record written without one gives the address part of each id.
    """
    ids = state.get("ids") or []
    addrs = state.get("addrs")
    if isinstance(addrs, list) and len(addrs) == len(ids) and set(map(type, addrs)) <= {list}:
        # Every node reads this list, as long as the round is large: checked and copied with
        # builtins (no Python-level loop per participant) when it is what closers write, a
        # non-empty string per address; anything else is cleaned up entry by entry.
        flat = list(itertools.chain.from_iterable(addrs))
        if set(map(type, flat)) <= {str} and all(flat):
            return tuple(map(tuple, addrs))
        return tuple(tuple(str(a) for a in entry if a) for entry in addrs)
    return tuple((str(node).rsplit("_", 2)[0],) for node in ids)
