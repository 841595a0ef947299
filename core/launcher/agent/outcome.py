"""Every node's outcome through the rendezvous store, so that every node can name the root cause.

When a multi-node job ends badly, each agent writes one record under
``launcher/<run id>/outcome/<round>/<group rank>`` of the round's store: its node, and the
earliest failure of its own workers (a :class:`~launcher.failures.report.ReportedFailure` as
JSON, stderr tail included) or why it ended the job (a signal). An agent that ends the job
writes its record *before* it closes the rendezvous, so whoever sees the rendezvous closed
finds at least that record. Each agent then reads the others' records (waiting a bounded time
for those that are still alive) and reports the earliest failure of the whole job as the root
cause. See "Which failure is the root cause" in docs/failures.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.store.api import KeyValueStore

__all__ = ["OUTCOME_TIMEOUT", "NodeOutcome", "collect_outcomes", "outcome_prefix", "publish_outcome"]

#: How long an agent waits for the other nodes' records, at most (a live node writes its own
#: within a monitor interval of seeing the job end; lost nodes are not waited for).
OUTCOME_TIMEOUT = 30.0


@dataclass
class NodeOutcome:
    """How the job ended on one node, as shared with the others."""

    group_rank: int
    node: str
    addr: str | None = None
    #: The node's earliest worker failure (``ReportedFailure.to_dict()``), if its workers failed.
    root: dict[str, Any] | None = None
    #: Why this node ended the job when no worker failed there (``the agent received SIGTERM``).
    reason: str | None = None
    #: One-line facts every node's report repeats (``a restart was not possible: ...``).
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``host (node 1, 10.0.0.2)``."""
        extra = ", ".join([f"node {self.group_rank}", *([self.addr] if self.addr and self.addr != self.node else [])])
        return f"{self.node} ({extra})"

    def encode(self) -> bytes:
        return json.dumps(
            {"g": self.group_rank, "node": self.node, "addr": self.addr, "root": self.root, "reason": self.reason,
             "notes": self.notes},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> NodeOutcome | None:
        try:
            data = json.loads(raw)
            notes = [str(n) for n in data.get("notes") or []]
            return cls(int(data["g"]), str(data["node"]), data.get("addr"), data.get("root"), data.get("reason"), notes)
        except (ValueError, KeyError, TypeError):
            return None


def outcome_prefix(run_id: str, round_: int) -> str:
    """Where the records of one round live."""
    return f"launcher/{run_id}/outcome/{round_}"


def publish_outcome(store: KeyValueStore, prefix: str, outcome: NodeOutcome) -> None:
    """Write this node's record (one ``set``)."""
    store.set(f"{prefix}/{outcome.group_rank}", outcome.encode())


def collect_outcomes(
    store: KeyValueStore,
    prefix: str,
    world_size: int,
    *,
    until: Callable[[dict[int, NodeOutcome]], bool],
    lost: Callable[[], set[int]] = set,
    timeout: float = OUTCOME_TIMEOUT,
) -> dict[int, NodeOutcome]:
    """The records written so far, by group rank, once ``until(records)`` holds, every node not
    ``lost`` has written, or ``timeout`` passes (whichever first). Store errors propagate."""
    deadline = time.monotonic() + timeout
    found: dict[int, NodeOutcome] = {}
    pending: Sequence[int] = list(range(world_size))
    pause = 0.02
    next_lost_check = 0.0
    gone: set[int] = set()
    while True:
        still = []
        for g in pending:
            key = f"{prefix}/{g}"
            if store.check([key]):
                record = NodeOutcome.decode(store.get(key))
                if record is not None:
                    found[g] = record
                    continue
            still.append(g)
        pending = still
        now = time.monotonic()
        if now >= next_lost_check:
            gone = lost()
            next_lost_check = now + 1.0
        if until(found) or all(g in gone for g in pending) or now >= deadline:
            return found
        time.sleep(min(pause, max(0.0, deadline - now)))
        pause = min(pause * 2, 0.25)
