"""The order ``--topology`` gives a round: nodes sharing their innermost domain take consecutive ranks.

Pure functions of the participant records the rendezvous's closer already reads (each node's
location is in its own record, under ``topo``), so placing costs the round nothing beyond
sorting what the closer sorts anyway: O(1) per node in the store. See docs/topology.md.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["location_record", "natural_key", "placement_key", "record_path", "ring_crossings"]

_NUMBER = re.compile(r"(\d+)")


def natural_key(component: str) -> tuple[tuple[int, int | str], ...]:
    """``component`` for sorting with its digits as numbers: ``leaf2`` before ``leaf12``."""
    return tuple((1, int(part)) if part.isdigit() else (0, part) for part in _NUMBER.split(component) if part)


@functools.lru_cache(maxsize=1 << 14)
def _path_key(path: tuple[str, ...]) -> tuple[tuple[tuple[int, int | str], ...], ...]:
    # A round has few distinct paths (one a switch), each shared by many nodes: computed once each.
    return tuple(natural_key(c) for c in path)


def location_record(path: Sequence[str], order: int | None) -> dict[str, Any]:
    """What a node puts in its participant record (``topo``) for its location."""
    record: dict[str, Any] = {"p": list(path)}
    if order is not None:
        record["o"] = order
    return record


def record_path(record: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The path in a participant record, ``None`` when it has none (or one this launcher cannot read)."""
    topo = record.get("topo")
    path = topo.get("p") if isinstance(topo, dict) else None
    if isinstance(path, list) and path and set(map(type, path)) == {str}:
        return tuple(path)
    return None


def placement_key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """The part of a record's sort key that ``--topology`` adds, before the address.

    Nodes with a path come first, ordered by path (so nodes of one innermost domain are
    adjacent), then by the source's own order inside the domain when it gave one; nodes without
    a path (``auto`` found none for them) follow, in torchrun's order.
    """
    path = record_path(record)
    if path is None:
        return (1,)
    topo = record["topo"]
    order = topo.get("o")
    own = (0, order) if isinstance(order, int) and not isinstance(order, bool) else (1, 0)
    return (0, _path_key(path), own)


def ring_crossings(domains: Sequence[Any]) -> int:
    """How many hops of the ring in rank order (rank i to i + 1, the last back to 0) join
    nodes of different domains; ``domains`` lists each rank's domain, in rank order."""
    if len(domains) < 2:
        return 0
    return sum(1 for i, domain in enumerate(domains) if domain != domains[i - 1])
