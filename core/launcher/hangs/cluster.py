"""Telling every node about a hang, through the rendezvous store.

Key schema (all under ``launcher/<run_id>/hang/<round>``, so a new round starts clean):

``alarm``
    JSON ``{"node", "group_rank", "reason"}`` of the first node that saw a hung rank. Written
    with compare-and-set, so the first detector wins and later ones read its alarm. Every agent
    looks for it each time it checks the rendezvous (once a second at most).
``node/<group_rank>``
    JSON :class:`~launcher.hangs.report.NodeSummary` of that node after its dump (one line of
    stack per rank; the full stacks stay in the node's stacks file).
``merged``
    JSON ``{"nodes": [...], "missing": [...], "omitted": n, "reason": ...}``: the merged report,
    written once by the merging node (group rank :data:`MERGER`) after it collected every node's
    summary (or its wait ran out); every other node reads this one key instead of every summary.
    At most :data:`MERGED_LIMIT` bytes: a bigger report keeps the nodes of the likeliest culprits
    (``omitted`` counts the others; their summaries stay in their own keys and stacks files).
``read`` and ``all_read``
    A counter each node increments once it has read the summaries, and the key the last one
    sets: a node waits for ``all_read`` (bounded) before stopping, so the node that serves the
    store does not take it away while another node is still reading.

``quiet``
    JSON ``[start, end]``, wall-clock seconds: the last span in which a rank of the node that
    wrote it was in a quiet section (a checkpoint, ``launcher.quiet()``). A node writes it once a
    second while one of its ranks is in a section, and once at its end; a node reads it only
    when one of its ranks would be judged hung (or a long interval learned): a rank waiting in a
    collective for a peer's checkpoint on another node is not hung (:func:`publish_quiet`).

And, with ``--hang-timeout auto``, one key per job (``launcher/<run_id>/hang/learned``, not per
round: a later round reads what an earlier one learned): ``{"steady": seconds, "checkpoint":
seconds}``, the largest timeouts any node learned (:func:`share_learned`).

Each node that sees the alarm dumps its own ranks, publishes its summary, and waits (bounded)
for the merged report before it stops its workers: the merging node writes it once every node
published, so no node's workers are torn down while another is still taking their peers' stacks.
A node thus makes O(1) store requests and reads O(1) bytes (at most :data:`MERGED_LIMIT`) at a
hang, whatever the number of nodes; the merging node reads every summary. When no merged report
comes in time (the merging node died, or its workers had ended before the hang), group rank
:data:`BACKUP_MERGER` merges instead (the first merged report written stands); without either, a
node reports its own ranks and names the others missing.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from launcher.hangs.report import HangReport, NodeSummary, order_hung
from launcher.rendezvous.api import STORE_FAILURES
from launcher.store.api import KeyValueStore

log = logging.getLogger("launcher.hangs")

#: The group rank that merges every node's summary into the one report all read.
MERGER = 0
#: The group rank that merges instead when no merged report comes in time.
BACKUP_MERGER = 1
#: Most bytes of the merged report (what every node reads at a hang).
MERGED_LIMIT = 64 * 1024
#: Above the limit, the merged report keeps the nodes of this many likeliest culprits.
MERGED_CULPRITS = 8
#: Seconds a node waits for the merged report beyond the merging node's wait for the summaries.
MERGE_SLACK = 5.0


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


def learned_key(run_id: str) -> str:
    """The key of a job's learned hang timeouts (every round's)."""
    return f"launcher/{run_id}/hang/learned"


# Never a stored value (those are JSON): a compare-and-set that expects it stores nothing and
# returns what the key holds (or this, when the key is missing), a read in one request.
_PROBE = b"\x00"


def _phases(value: bytes) -> dict[str, float]:
    """The learned timeouts a stored value holds, per phase (the phases with a number)."""
    try:
        body = json.loads(value)
        return {str(phase): float(seconds) for phase, seconds in body.items() if seconds is not None}
    except (ValueError, TypeError, AttributeError):
        return {}


def share_learned(store: KeyValueStore, key: str, values: dict[str, float | None], *,
                  tries: int = 8) -> dict[str, float]:
    """Raise each learned timeout at ``key`` (``{"steady": s, "checkpoint": c}``) to this node's
    in ``values`` unless a node's is larger, and return the largest per phase (a phase no node
    learned is absent). One request when this node has nothing larger to give (every node calls
    it every few seconds), a compare-and-set more when it has (rarely: a learned value only
    grows, by clear steps): O(1) requests per node, whatever the number of nodes."""
    current = store.compare_set(key, _PROBE, _PROBE)
    for _ in range(tries):
        stood = {} if current == _PROBE else _phases(current)
        merged = dict(stood)
        for phase, seconds in values.items():
            if seconds is not None and seconds > merged.get(phase, float("-inf")):
                merged[phase] = float(seconds)
        if merged == stood:
            return stood
        desired = json.dumps(merged, separators=(",", ":"), sort_keys=True).encode()
        current = store.compare_set(key, b"" if current == _PROBE else current, desired)
        if current == desired:
            return merged
    return {} if current == _PROBE else _phases(current)


def quiet_key(base: str) -> str:
    """The key that says when a rank of the job was last in a quiet section (one round's)."""
    return f"{base}/quiet"


def publish_quiet(store: KeyValueStore, key: str, start: float, end: float) -> None:
    """A rank of this node was in a quiet section from ``start`` to ``end`` (wall-clock seconds):
    one request (the last node to write stands; a node in a section writes again a second later)."""
    store.set(key, json.dumps([round(start, 3), round(end, 3)]).encode())


def read_quiet(store: KeyValueStore, key: str) -> tuple[float, float] | None:
    """The last quiet span a node published (wall-clock seconds), or ``None``: one request."""
    value = store.compare_set(key, _PROBE, _PROBE)
    if value == _PROBE:
        return None
    try:
        start, end = json.loads(value)
        return float(start), float(end)
    except (ValueError, TypeError):
        return None


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
        except STORE_FAILURES + (ValueError,) as exc:
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
    except STORE_FAILURES as exc:
        log.debug("not every node read the hang summaries: %s", exc)
        return False


def publish_merged(store: KeyValueStore, base: str, nodes: list[NodeSummary], missing: list[int], *,
                   reason: str | None, tolerance: float) -> tuple[list[NodeSummary], int]:
    """Write the merged report of ``nodes`` (every node's summary that came, in group-rank order);
    the nodes it holds and how many were left out to keep it within :data:`MERGED_LIMIT`."""
    kept, omitted = nodes, 0
    body = {"nodes": [node.to_dict(full=False) for node in nodes], "missing": missing, "omitted": 0,
            "reason": reason}
    value = json.dumps(body, separators=(",", ":")).encode()
    if len(value) > MERGED_LIMIT:
        culprits = order_hung([e for node in nodes for e in node.ranks], tolerance)[:MERGED_CULPRITS]
        owner = {id(e): node.group_rank for node in nodes for e in node.ranks}
        wanted = {MERGER} | {owner[id(e)] for e in culprits}
        kept = [node for node in nodes if node.group_rank in wanted]
        omitted = len(nodes) - len(kept)
        body.update(nodes=[node.to_dict(full=False) for node in kept], omitted=omitted)
        value = json.dumps(body, separators=(",", ":")).encode()
    store.compare_set(f"{base}/merged", b"", value)  # the first merged report stands (see BACKUP_MERGER)
    return kept, omitted


def read_merged(store: KeyValueStore, base: str,
                timeout: float) -> tuple[list[NodeSummary], list[int], int, str | None]:
    """The merged report (waiting ``timeout`` seconds at most): its nodes, the group ranks
    missing, how many nodes it left out, and the culprit's reason when it left some out."""
    key = f"{base}/merged"
    store.wait([key], timeout=timeout)
    body = json.loads(store.get(key, timeout=5.0))
    nodes = [NodeSummary.from_dict(item) for item in body["nodes"]]
    return nodes, [int(r) for r in body.get("missing", [])], int(body.get("omitted", 0)), body.get("reason")


def exchange(store: KeyValueStore, base: str, summary: NodeSummary, world: int, *, tolerance: float,
             timeout: float) -> tuple[list[NodeSummary], list[int], int, str | None]:
    """Publish this node's ``summary`` and get the merged report: every node's summary in
    group-rank order (``summary`` itself in its place), the group ranks missing, the nodes left
    out of the merged report, and the culprit's reason when some were (``None`` otherwise: the
    report names its own). The merging node waits ``timeout`` seconds at most for the summaries
    and keeps them all; the others wait :data:`MERGE_SLACK` seconds more for the merged report.
    Without it, :data:`BACKUP_MERGER` merges (waiting :data:`MERGE_SLACK` at most for the
    summaries), the others wait twice that for its report, then report their own ranks alone.
    Ends with :func:`finish`."""
    publish(store, base, summary)
    nodes, omitted, reason = [summary], 0, None
    missing: list[int] = []
    if summary.group_rank == MERGER:
        nodes, missing = _merge(store, base, summary, world, timeout, tolerance)
        finish(store, base, world, timeout)
        return nodes, missing, 0, None
    merged = _read(store, base, timeout + MERGE_SLACK)
    if merged is None and summary.group_rank == BACKUP_MERGER:
        # The merging node is gone (or stopped before the hang): this node merges instead, and
        # the summaries it reads are there already (every node published before waiting).
        log.warning("no merged hang report from the node with group rank %d: merging the summaries here", MERGER)
        nodes, missing = _merge(store, base, summary, world, MERGE_SLACK, tolerance)
        finish(store, base, world, timeout)
        return nodes, missing, 0, None
    if merged is None:
        merged = _read(store, base, 2 * MERGE_SLACK)
    if merged is None:
        log.warning("no merged hang report from the nodes with group rank %d or %d", MERGER, BACKUP_MERGER)
        missing = [r for r in range(world) if r != summary.group_rank]
    else:
        others, missing, omitted, reason = merged
        nodes += [node for node in others if node.group_rank != summary.group_rank]
        nodes.sort(key=lambda node: node.group_rank)
        if not omitted:
            reason = None
    finish(store, base, world, timeout)
    return nodes, missing, omitted, reason


def _merge(store: KeyValueStore, base: str, summary: NodeSummary, world: int, timeout: float,
           tolerance: float) -> tuple[list[NodeSummary], list[int]]:
    """Collect every node's summary and write the merged report; every summary (this node keeps
    them all: its report and stacks file are the whole one) and the group ranks missing."""
    others, missing = collect(store, base, world, timeout, own=summary.group_rank)
    nodes = sorted([summary, *others], key=lambda node: node.group_rank)
    whole = HangReport("", "", nodes, tolerance=tolerance)
    publish_merged(store, base, nodes, missing, reason=whole.culprit_reason(), tolerance=tolerance)
    return nodes, missing


def _read(store: KeyValueStore, base: str,
          timeout: float) -> tuple[list[NodeSummary], list[int], int, str | None] | None:
    try:
        return read_merged(store, base, timeout)
    except STORE_FAILURES + (ValueError, KeyError, TypeError) as exc:
        log.debug("no merged hang report: %s", exc)
        return None
