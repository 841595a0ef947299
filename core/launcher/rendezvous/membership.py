"""Who takes part in a round: node descriptors, the records nodes store, a node's membership.

The values under the ``node/<i>``, ``roster``, ``place/<i>`` and ``sealed`` keys (their layout
is in "Keys" in docs/rendezvous.md) are JSON objects; :func:`decode` reads them back, and
:class:`Membership` is what a node keeps of a sealed round it takes part in. A node learns its
place from two small records; the round's full participants list (its ``roster``) is read from
the store only when something asks for it (:class:`Roster`), so that a round costs each node
O(1) bytes however many nodes it has.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from launcher.rendezvous.api import SMALL_ROUND_MAX, RendezvousError

__all__ = [
    "COMPRESS_OVER",
    "Membership",
    "NodeDescriptor",
    "Roster",
    "decode",
    "encode",
    "encode_large",
    "list_ids",
    "places",
    "sealed_addresses",
    "sealed_summary",
]

T = TypeVar("T")

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
        self, *, is_host: bool, was_rank0: bool, local_world_size: int | None, via: str | None = None,
        topo: Mapping[str, Any] | None = None,
    ) -> bytes:
        """The participant record this node writes under ``<r>/node/<i>``; ``via`` is the
        address its store connection comes from (what the store's host sees), when known;
        ``topo`` its location with ``--topology`` (:func:`launcher.topology.order.location_record`)."""
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
        if topo:
            value["topo"] = dict(topo)
        return encode(value)


class Roster(Sequence[T]):
    """One column of a round's participants list (ids, local world sizes), in group-rank order,
    read from the store on first use and kept.

    Its length, and the entries in ``known`` (this node's own id at its own rank, say), need no
    read: the store's host would send every node of a large round O(N) bytes otherwise. ``load``
    returns the whole column; what it raises (the store is gone) reaches the caller.
    """

    def __init__(self, length: int, load: Callable[[], Sequence[T]], known: Mapping[int, T] | None = None) -> None:
        self._length = length
        self._load = load
        self._known = dict(known or {})
        self._values: list[T] | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """Whether the whole column has been read."""
        return self._values is not None

    def _all(self) -> list[T]:
        with self._lock:  # the agent's thread and the heartbeat's may ask at once: one read
            if self._values is None:
                values = list(self._load())
                if len(values) != self._length:
                    raise RendezvousError(
                        f"the round's participants list has {len(values)} entries, not {self._length}"
                    )
                self._values = values
            return self._values

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if self._values is None and isinstance(index, int):
            position = index + self._length if index < 0 else index
            if position in self._known:
                return self._known[position]
        return self._all()[index]

    def __iter__(self) -> Iterator[T]:
        return iter(self._all())

    def __contains__(self, value: object) -> bool:
        return value in self._all()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Roster, list, tuple)):
            return self._all() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if self._values is None:
            return f"Roster({self._length} entries, not read)"
        return f"Roster({self._values!r})"


@dataclass(frozen=True)
class Membership:
    """This node's place in a sealed round.

    Everything but :attr:`ids`, :attr:`local_world_sizes` and :attr:`addresses` comes from the
    round's small records (``sealed`` and this node's ``place``); those three read the round's
    ``roster`` through ``load`` when first used (one read, kept; none for the entries already
    known: this node's own id, the host's).
    """

    round: int
    rank: int
    #: Number of participants (the group world size).
    size: int
    #: Join indexes 1..count were considered by the closer; later ones are waiting.
    count: int
    #: Group rank of the participant that serves the store, if one does.
    host_rank: int | None = None
    #: This node's id (at :attr:`rank`), and the id of the node at :attr:`host_rank`.
    node_id: str = ""
    host_id: str | None = None
    #: The round's world size, when every node said its local world size (``None`` otherwise).
    world_size: int | None = None
    #: Participants of round ``round - 1`` not in this one: some of their names (all, up to
    #: SMALL_ROUND_MAX) and how many; ``None`` when that round did not form or is not known.
    left: tuple[str, ...] | None = None
    left_count: int = 0
    #: Reads the round's ``roster`` record (``None``: not known; the lists then cannot be read
    #: past their known entries, and :attr:`addresses` is empty).
    load: Callable[[], Mapping[str, Any]] | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def _roster(self) -> Mapping[str, Any]:
        return self.load() if self.load is not None else {}

    def _column(self, name: str, default: Any) -> list[Any]:
        value = self._roster.get(name)
        return list(value) if isinstance(value, list) else [default] * len(self._roster.get("ids") or [])

    @functools.cached_property
    def ids(self) -> Roster[str]:
        """Node ids of every participant, in group-rank order (read when first iterated)."""
        known = {self.rank: self.node_id} if self.node_id else {}
        if self.host_rank is not None and self.host_id:
            known[self.host_rank] = self.host_id
        return Roster(self.size, lambda: [str(i) for i in self._column("ids", "")], known)

    @functools.cached_property
    def paths(self) -> list[str | None]:
        """Each participant's ``--topology`` path (``spine0.leaf12``), in group-rank order; ``None``
        for a node without one, and for every node of a round without ``--topology`` (read when
        first used, from the ``roster``)."""
        return [p if isinstance(p, str) else None for p in self._column("paths", None)]

    @functools.cached_property
    def indexes(self) -> list[int | None]:
        """Each participant's join index (its ``node/<i>`` record), in group-rank order (read when
        first used, from the ``roster``)."""
        return [i if isinstance(i, int) and not isinstance(i, bool) else None for i in self._column("idx", None)]

    @functools.cached_property
    def local_world_sizes(self) -> Roster[int | None]:
        """Each participant's local world size, in group-rank order (read when first used)."""
        return Roster(self.size, lambda: self._column("lws", None))

    @functools.cached_property
    def addresses(self) -> tuple[tuple[str, ...], ...]:
        """Each participant's addresses, in group-rank order: its announced address, then the one
        its store connection came from when that differs (empty when the round's record is not
        known). Read when first asked (by the nodes that serve a store: group rank 0 and the
        rendezvous's host), not by every node of a large round."""
        return sealed_addresses(self._roster) if self.load is not None else ()


#: A record longer than this (bytes of JSON) is stored zlib-compressed by :func:`encode_large`:
#: a large round's ``roster`` record (about 90 bytes per node).
COMPRESS_OVER = 64 << 10
#: The first byte of a zlib stream (deflate, 32 KiB window); no JSON text starts with it.
_ZLIB_FIRST = 0x78


def encode(value: Any) -> bytes:
    """``value`` as the compact JSON every record is stored as."""
    return json.dumps(value, separators=(",", ":")).encode()


def encode_large(value: Any) -> bytes:
    """``value`` as :func:`encode` writes it, zlib-compressed when longer than
    :data:`COMPRESS_OVER`: a round's ``roster`` (4,096 nodes: about 360 KB, or 50 KB compressed),
    which the nodes that need it read whole."""
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


def _local_world_sizes(roster: Mapping[str, Any]) -> list[int] | None:
    """Every participant's local world size, in group-rank order, when each one gave it."""
    sizes = roster.get("lws") or []
    if len(sizes) == len(roster.get("ids") or []) and all(isinstance(s, int) for s in sizes):
        return list(sizes)
    return None


def sealed_summary(roster: Mapping[str, Any], previous_ids: Sequence[str] | None = None) -> dict[str, Any]:
    """The small ``sealed`` record of a round whose full record (what
    :func:`~launcher.rendezvous.rounds.sealed_value` gives, stored as its ``roster``) is
    ``roster``: its size, closer, host and world size, none of its lists. Every node reads it.

    ``previous_ids``: the participants of the round before, when it formed: the record then
    also says how many of them are not in this one (``nleft``) and names up to
    :data:`~launcher.rendezvous.api.SMALL_ROUND_MAX` of them (``left``), so that no node reads
    both rounds' lists to tell who left."""
    ids = roster.get("ids") or []
    host_rank = roster.get("hr")
    sizes = _local_world_sizes(roster)
    left: dict[str, Any] = {}
    if previous_ids is not None:
        staying = set(ids)
        gone = [node for node in previous_ids if node not in staying]
        left = {"left": gone[:SMALL_ROUND_MAX], "nleft": len(gone)}
    return {
        **left,
        "state": "sealed",
        "count": roster.get("count"),
        "n": len(ids),
        "closer": roster.get("closer"),
        "hr": host_rank,
        "hid": ids[host_rank] if isinstance(host_rank, int) and 0 <= host_rank < len(ids) else None,
        "ws": sum(sizes) if sizes is not None else None,
    }


def places(roster: Mapping[str, Any]) -> list[bytes]:
    """The ``place/<i>`` records of join indexes 1..count for a round's full record: the group
    rank of the node with that index, or ``{"rank": null}`` for an index the closer did not
    take into the round. (Global ranks are not here: the agent assigns them with its role's
    ranks, as torch does, in one O(1) exchange a node.)"""
    count = int(roster.get("count") or 0)
    where = {index: rank for rank, index in enumerate(roster.get("idx") or []) if isinstance(index, int)}
    return [encode({"rank": where.get(i)}) for i in range(1, count + 1)]
