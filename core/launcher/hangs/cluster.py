"""Telling every node about a hang, through the rendezvous store.

Key schema (all under ``launcher/<run_id>/hang/<round>``, so a new round starts clean):

``alarm``
    JSON ``{"node", "group_rank", "reason"}`` of the first node that saw a hung rank. Written
    with compare-and-set, so the first detector wins and later ones read its alarm. Every agent
    looks for it each time it checks the rendezvous (once a second at most).
``node/<group_rank>``
    JSON :class:`~launcher.hangs.report.NodeSummary` of that node after its dump (one line of
    stack per rank; the full stacks stay in the node's stacks file).
``read`` and ``all_read``
    A counter each node increments once it has read the summaries, and the key the last one
    sets: a node waits for ``all_read`` (bounded) before stopping, so the node that serves the
    store does not take it away while another node is still reading.

Each node that sees the alarm dumps its own ranks, publishes its summary, and waits (bounded)
for every other node's before it stops its workers, so no node's workers are torn down while
another is still taking their peers' stacks.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from launcher.hangs.report import NodeSummary
from launcher.rendezvous.api import RendezvousError
from launcher.store.api import KeyValueStore, StoreError

log = logging.getLogger("launcher.hangs")


def prefix(run_id: str, round_: int) -> str:
    """The keys of one round's hang alarm."""
    return f"launcher/{run_id}/hang/{round_}"


def raise_alarm(store: KeyValueStore, base: str, alarm: dict[str, Any]) -> dict[str, Any]:
    """Post ``alarm`` unless another node did first; the alarm that stands."""
    value = json.dumps(alarm, separators=(",", ":")).encode()
    stored = store.compare_set(f"{base}/alarm", b"", value)
    try:
        return dict(json.loads(stored))
    except (ValueError, TypeError):
        return alarm


def check_alarm(store: KeyValueStore, base: str) -> dict[str, Any] | None:
    """Another node's alarm, if one was raised (never waits)."""
    key = f"{base}/alarm"
    if not store.check([key]):
        return None
    try:
        return dict(json.loads(store.get(key, timeout=5.0)))
    except (ValueError, TypeError):
        return {"node": "?", "reason": "a hang (unreadable alarm)"}


def publish(store: KeyValueStore, base: str, summary: NodeSummary) -> None:
    store.set(f"{base}/node/{summary.group_rank}", summary.to_bytes())


def collect(store: KeyValueStore, base: str, world: int, timeout: float, *,
            own: int | None = None) -> tuple[list[NodeSummary], list[int]]:
    """Every other node's summary (not ``own``'s), waiting ``timeout`` seconds at most in all;
    and the group ranks missing."""
    deadline = time.monotonic() + timeout
    summaries: list[NodeSummary] = []
    missing: list[int] = []
    for group_rank in range(world):
        if group_rank == own:
            continue
        key = f"{base}/node/{group_rank}"
        try:
            store.wait([key], timeout=max(0.01, deadline - time.monotonic()))
            summaries.append(NodeSummary.from_dict(json.loads(store.get(key, timeout=5.0))))
        except (StoreError, RendezvousError, OSError, ValueError) as exc:
            log.warning("no hang summary from the node with group rank %d: %s", group_rank, exc)
            missing.append(group_rank)
    return summaries, missing


def finish(store: KeyValueStore, base: str, world: int, timeout: float) -> bool:
    """Say this node has read every summary, and wait (``timeout`` at most) until all have."""
    try:
        if store.add(f"{base}/read", 1) >= world:
            store.set(f"{base}/all_read", b"1")
        store.wait([f"{base}/all_read"], timeout=timeout)
        return True
    except (StoreError, RendezvousError, OSError) as exc:
        log.debug("not every node read the hang summaries: %s", exc)
        return False
