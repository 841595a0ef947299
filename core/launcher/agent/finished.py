"""Which nodes of a round have finished, and what that rules out for the others.

A node whose workers all succeeded waits at the exit barrier and joins no other round: once
one node of a round has finished, that round can no longer re-form. A restart after a worker
failure, a re-form for a lost node or for a joining one would wait for a node that never comes
(torchrun waits there until its join timeout, 600 s). So the others, instead, end the job, and
a node that finished and then vanished is not taken for a lost one.

The records live in the round's agent store (``RendezvousInfo.store``), under
``launcher/<run id>/exit/<round>``:

============== ============================================================================
``count``      ``add 1`` by each node that finished; the value it gets back is its arrival ``k``
``node/<k>``   the ``k``-th arrival: ``{"g": group rank, "id": node id, "label": "host (node 1, addr)"}``
``reforming``  ``add 1`` by each node about to leave the round for another one
``done``       set by the last arrival (the exit barrier, :mod:`launcher.agent.barrier`)
============== ============================================================================

A node that fails just as another finishes: the failing node adds to ``reforming`` before it
reads ``count``, the finishing one adds to ``count`` before it reads ``reforming`` (and keeps
reading it while it waits). The store orders the two ``add``s, so at least one of the two nodes
sees the other, and the job ends instead of re-forming without the finished node.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.rendezvous.api import STORE_FAILURES

if TYPE_CHECKING:  # pragma: no cover
    from launcher.rendezvous.api import RendezvousInfo
    from launcher.store.api import KeyValueStore

__all__ = [
    "FinishedNode",
    "announce_finished",
    "claim_reform",
    "describe_ranks",
    "exit_prefix",
    "finished_count",
    "finished_nodes",
    "no_reform_note",
    "node_ranks",
    "read_finished",
    "reform_claimed",
    "withdraw_claim",
    "await_withdrawals",
    "await_final_round_left",
    "job_succeeded",
    "mark_job_succeeded",
]

#: The job-level record that the job's last round finished on every node (its round number),
#: under ``launcher/<run id>/`` in the rendezvous store: a node that was left out of that round
#: (it re-formed late, after its worker hung, say) reads it when it finds the job closed, and
#: knows the job succeeded without it (:func:`job_succeeded`).
_SUCCEEDED = "succeeded"



@dataclass(frozen=True)
class FinishedNode:
    """A node of the round whose workers all succeeded (it waits at the exit barrier)."""

    group_rank: int
    #: Its rendezvous node id (``participants``), empty where the backend has none (static).
    node_id: str
    #: ``host (node 1, 10.0.0.2)``.
    label: str


def exit_prefix(run_id: str, round_: int) -> str:
    """Where a round's exit records live in its agent store."""
    return f"launcher/{run_id}/exit/{round_}"


def announce_finished(store: KeyValueStore, prefix: str, node: FinishedNode) -> int:
    """Record that ``node`` finished; how many nodes of the round have finished, it included."""
    arrival = store.add(f"{prefix}/count", 1)
    store.set(f"{prefix}/node/{arrival}",
              json.dumps({"g": node.group_rank, "id": node.node_id, "label": node.label}).encode())
    return arrival


def finished_count(store: KeyValueStore, prefix: str) -> int:
    """How many nodes of the round have finished (one store call). Store errors propagate."""
    return max(0, store.add(f"{prefix}/count", 0))


def read_finished(store: KeyValueStore, prefix: str, known: Sequence[FinishedNode] = (),
                  count: int | None = None) -> list[FinishedNode]:
    """The nodes that finished, in order of arrival: ``known`` (the first ones, read before)
    and those after them, up to ``count`` (read when ``None``). One ``multi_get`` of the new
    records only, so that a node that keeps looking reads each record once. Store errors propagate."""
    if count is None:
        count = finished_count(store, prefix)
    if count <= len(known):
        return list(known)
    keys = [f"{prefix}/node/{k}" for k in range(len(known) + 1, count + 1)]
    # A node writes its record right after its add: wait for it, briefly.
    values = store.multi_get(keys, timeout=5.0)
    nodes = list(known)
    for raw in values:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            data = json.loads(raw)
            nodes.append(FinishedNode(int(data["g"]), str(data.get("id") or ""), str(data["label"])))
    return nodes


def finished_nodes(info: RendezvousInfo, run_id: str) -> list[FinishedNode]:
    """The nodes of ``info``'s round that finished; empty on one node or when the store cannot
    say (the caller then goes on as if none had)."""
    if info.store is None or info.group_world_size == 1:
        return []
    try:
        return read_finished(info.store, exit_prefix(run_id, info.round))
    except STORE_FAILURES:
        return []


def claim_reform(info: RendezvousInfo, run_id: str) -> list[FinishedNode]:
    """Say this node is about to leave ``info``'s round for another; the nodes that had already
    finished (non-empty: the new round cannot form, end the job instead). See the module's
    docstring for why the claim comes first."""
    if info.store is None or info.group_world_size == 1:
        return []
    prefix = exit_prefix(run_id, info.round)
    try:
        info.store.add(f"{prefix}/reforming", 1)
        return read_finished(info.store, prefix)
    except STORE_FAILURES:
        return []


def reform_claimed(store: KeyValueStore, prefix: str) -> bool:
    """Whether a node of the round has left it, or is leaving it, for another round."""
    return store.add(f"{prefix}/reforming", 0) > 0


def withdraw_claim(info: RendezvousInfo, run_id: str) -> None:
    """A node whose new round was closed (by a node that had finished) has read what it needed
    from ``info``'s round: the node that closed it may stop serving the store now."""
    if info.store is not None and info.group_world_size > 1:
        with contextlib.suppress(*STORE_FAILURES):
            info.store.add(f"{exit_prefix(run_id, info.round)}/reforming", -1)


def await_withdrawals(store: KeyValueStore, prefix: str, timeout: float) -> bool:
    """Until every claim to re-form is withdrawn (the claimants saw the job closed and read the
    records), ``timeout`` seconds at most; whether they all were."""
    deadline = time.monotonic() + timeout
    try:
        while store.add(f"{prefix}/reforming", 0) > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
    except STORE_FAILURES:
        return False
    return True


def no_reform_note(finished: Iterable[FinishedNode], what: str = "a restart") -> str:
    """``a restart was not possible: gpu-a (node 0, 10.0.0.1) had finished ...``."""
    nodes = sorted(finished, key=lambda n: n.group_rank)
    names = ", ".join(n.label for n in nodes)
    had = "had" if len(nodes) == 1 else "had all"
    return (f"{what} was not possible: {names} {had} finished (every worker succeeded) and will join no other "
            "round, so the job ends here")


def node_ranks(info: RendezvousInfo, run_id: str) -> dict[int, range]:
    """Every node's global ranks, by group rank: from the round's local world sizes, else from
    the rank exchange's records (one store call); empty when neither can be read."""
    try:
        sizes = list(info.local_world_sizes)  # the core's rendezvous reads them now (its roster)
    except STORE_FAILURES:
        return {}
    if len(sizes) != info.group_world_size and info.store is not None:
        keys = [f"launcher/{run_id}/ranks/{info.round}/node/{g}" for g in range(info.group_world_size)]
        try:
            sizes = [int(json.loads(raw)[1]) for raw in info.store.multi_get(keys, timeout=5.0)]
        except STORE_FAILURES + (ValueError, KeyError, TypeError, IndexError):
            return {}
    ranks, base = {}, 0
    for g, size in enumerate(sizes):
        ranks[g] = range(base, base + size)
        base += size
    return ranks


def describe_ranks(ranks: Sequence[int] | None) -> str:
    """``ranks 2-3``, ``rank 5``, or ``its ranks`` when they are not known."""
    if not ranks:
        return "its ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _job_store(handler: object, run_id: str) -> KeyValueStore | None:
    shared = getattr(handler, "shared_store", None)  # the core's rendezvous has one; others may not
    return shared(f"launcher/{run_id}/") if callable(shared) else None


def mark_job_succeeded(handler: object, run_id: str, round_: int) -> None:
    """Every node of round ``round_`` finished: say so where any node of the job can read it
    (one ``set``; a store that fails here changes nothing for this node)."""
    with contextlib.suppress(*STORE_FAILURES):
        store = _job_store(handler, run_id)
        if store is not None:
            store.set(_SUCCEEDED, str(round_).encode())


def job_succeeded(handler: object, run_id: str) -> int | None:
    """The round in which the job finished on every node, if it did (``None``: not known, or not)."""
    with contextlib.suppress(*STORE_FAILURES, ValueError):
        store = _job_store(handler, run_id)
        if store is not None and store.check([_SUCCEEDED]):
            return int(store.get(_SUCCEEDED, 5.0))
    return None


def await_final_round_left(handler: object, run_id: str, final: int, timeout: float) -> None:
    """Until every node of round ``final`` said it is leaving its exit barrier (``all_left``), the
    store fails, or ``timeout``: a node left out of that round may serve the store (c10d's host),
    and must not shut it down under the round's nodes while they still read it."""
    from launcher.rendezvous.keys import RendezvousKeys
    from launcher.rendezvous.store_ops import POLL_MAX

    shared = getattr(handler, "shared_store", None)
    if not callable(shared):
        return
    key = f"{exit_prefix(run_id, final)}/all_left"
    deadline = time.monotonic() + timeout
    pause = 0.01
    with contextlib.suppress(*STORE_FAILURES):
        store = shared(RendezvousKeys(run_id).agent(final))
        while not store.check([key]) and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, POLL_MAX)
