"""Global and role ranks for this node's workers, agreed through the rendezvous store.

Every node publishes its role and local world size under one key; the node of group rank 0 reads
them all, computes every node's rank offsets and writes one key per node, which that node reads.
Each node other than rank 0 thus makes O(1) store calls, and rank 0 makes O(1) batched calls, so
the exchange stays cheap at thousands of nodes.

A node's record may carry one more item, which rank 0 combines over every node into one answer
written back with each node's ranks: how ``--max-no-progress-restarts`` agrees on the job's
furthest step without a store call of its own (:mod:`launcher.agent.progress`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.store.api import KeyValueStore


@dataclass(frozen=True)
class NodeRanks:
    """Where this node's workers sit in the job."""

    base_rank: int
    world_size: int
    base_role_rank: int
    role_world_size: int
    #: What ``combine`` made of every node's ``share`` (``None`` without one).
    shared: Any = None


def assign_ranks(
    store: KeyValueStore | None,
    prefix: str,
    group_rank: int,
    group_world_size: int,
    role: str,
    local_world_size: int,
    timeout: float,
    share: Any = None,
    combine: Callable[[Sequence[Any]], Any] | None = None,
) -> NodeRanks:
    """This node's rank offsets; a one-node job needs no store.

    ``share`` (JSON-able) goes with this node's record; rank 0's ``combine`` turns every node's
    (``None`` for a node without one) into the ``shared`` answer each node gets."""
    if group_world_size == 1 or store is None:
        shared = combine([share]) if combine is not None and share is not None else None
        return NodeRanks(0, local_world_size, 0, local_world_size, shared)
    import json
    record: list[Any] = [role, local_world_size] + ([share] if share is not None else [])
    store.set(f"{prefix}/node/{group_rank}", json.dumps(record).encode())
    shared = None
    if group_rank == 0:
        keys = [f"{prefix}/node/{rank}" for rank in range(group_world_size)]
        nodes = [json.loads(value) for value in store.multi_get(keys, timeout=timeout)]
        if combine is not None:
            shared = combine([node[2] if len(node) > 2 else None for node in nodes])
        nodes = [node[:2] for node in nodes]
        world = sum(size for _, size in nodes)
        role_sizes: dict[str, int] = {}
        results = []
        base = 0
        for node_role, size in nodes:
            results.append([base, world, role_sizes.get(node_role, 0)])
            base += size
            role_sizes[node_role] = role_sizes.get(node_role, 0) + size
        out_keys = [f"{prefix}/assigned/{rank}" for rank in range(group_world_size)]
        extra = [shared] if shared is not None else []
        values = [
            json.dumps([b, w, r, role_sizes[nodes[i][0]], *extra]).encode() for i, (b, w, r) in enumerate(results)
        ]
        store.multi_set(out_keys, values)
    base_rank, world, base_role, role_world, *rest = json.loads(store.get(f"{prefix}/assigned/{group_rank}", timeout))
    return NodeRanks(base_rank, world, base_role, role_world, rest[0] if rest else None)
