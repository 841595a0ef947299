"""``--segment N``: which nodes of a round train, in whole segments of N nodes of one domain.

A node's *domain* is its whole path (``spine0.leaf12``: the innermost switch or NVLink domain,
named with everything above it, so two ``leaf1`` under different spines are two domains). The
closer of a round calls :func:`select_segments` on the participant records it has read anyway:
grouping by domain is one pass, so placement stays O(1) per node. See docs/topology.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from launcher.topology.order import natural_key, record_path

__all__ = ["domain_number", "select_segments"]


def domain_number(path: Sequence[str]) -> int:
    """A stable number for the domain ``path`` (its counter's key in the store: any text may be in
    a path, a number is a safe key name)."""
    digest = hashlib.blake2s("\x1f".join(path).encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big")


def select_segments(
    nodes: Sequence[Mapping[str, Any]],
    size: int,
    min_nodes: int,
    max_nodes: int,
    key: Callable[[Mapping[str, Any]], Any],
    previous: Collection[str] = (),
    *,
    host: Callable[[Mapping[str, Any]], bool] = lambda node: False,
    host_first: bool = False,
) -> list[Mapping[str, Any]] | None:
    """The records of the nodes that train, in group-rank order; ``None`` when the whole segments
    among ``nodes`` hold fewer than ``min_nodes``.

    ``size`` is N; ``min_nodes`` and ``max_nodes`` are multiples of it. Each domain gives
    ``len // size`` whole segments, and as many are taken as ``max_nodes`` allows: first from the
    domains that hold most of the previous round's participants (``previous``: their ids), so
    that a re-form keeps the surviving segments and fills a lost node's place from its own
    domain; then from the domain of the store's host (``host`` tells it: it serves on anyway);
    then in path order. Inside a domain, previous participants are taken first, then by ``key``
    (the closer's usual order). The result is ordered by domain (the host's first when
    ``host_first``, as ``stable_rank0`` asks; then path order), then by ``key``: the segments of
    one domain hold consecutive ranks. Nodes without a path are never taken.
    """
    domains: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for node in nodes:
        path = record_path(node)
        if path is not None:
            domains.setdefault(path, []).append(node)
    if sum(len(members) // size for members in domains.values()) * size < min_nodes:
        return None

    def kept(node: Mapping[str, Any]) -> bool:
        return str(node.get("id")) in previous

    def path_order(path: tuple[str, ...]) -> tuple[Any, ...]:
        return tuple(natural_key(c) for c in path)

    survivors = {path: sum(map(kept, members)) for path, members in domains.items()} if previous else {}
    hosting = {path for path, members in domains.items() if any(map(host, members))}
    wanted = max_nodes // size
    chosen: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for path in sorted(domains, key=lambda p: (-survivors.get(p, 0), p not in hosting, path_order(p))):
        take = min(len(domains[path]) // size, wanted)
        if take:
            wanted -= take
            chosen[path] = sorted(domains[path], key=lambda n: (not kept(n), key(n)))[: take * size]
    order = sorted(chosen, key=lambda p: (not (host_first and p in hosting), path_order(p)))
    return [node for path in order for node in sorted(chosen[path], key=key)]
