"""Straggler verdicts across nodes: every node publishes its summary, one node judges, all read the verdict.

Each interval every node rewrites its one summary key (:mod:`launcher.stragglers.cluster`). The
*judging node*, group rank :data:`JUDGE` of the round (the node that serves the workers' store, so
it reads the summaries over loopback), reads every node's summary, judges the window and keeps the
hysteresis (:class:`Judge`), and rewrites one key holding its last :data:`VERDICTS_KEPT` verdicts.
Every other node reads that key and applies the verdicts it has not applied yet, in order: the
same verdicts, change for change, as when every node judged every summary itself (main before
issue 40), at most one interval later on a node that read just before the judge wrote.

Store requests per interval: 3 for a node (set its key, check and get the verdicts); the judge's
are 4 of O(1) size and one multi-get of every node's summary. The judge serves the store: when it
dies or is put out, the round ends for everyone and the next round's group rank 0 judges.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from launcher.store.api import KeyValueStore
from launcher.stragglers import cluster
from launcher.stragglers.verdict import (
    MAX_INTERVALS,
    Change,
    Finding,
    RankSample,
    StragglerTracker,
    judge,
    select_window,
    window,
)

log = logging.getLogger("launcher.stragglers")

#: The group rank that judges (it serves the workers' store).
JUDGE = 0
#: Verdicts the verdicts key holds: a node that missed a look catches up from them.
VERDICTS_KEPT = 5


def verdicts_key(run_id: str, round_: int) -> str:
    return f"launcher/stragglers/{run_id}/{round_}/verdicts"


class Verdict(NamedTuple):
    """The judge's verdict on the window ending at interval ``number``."""

    number: int
    #: Every rank named after this window (rank order), with its latest finding.
    named: list[Finding]
    #: Ranks this window cleared.
    cleared: list[Finding]
    #: Whether the named ranks changed (a line is printed, an event emitted).
    changed: bool

    def change(self) -> Change | None:
        return Change(list(self.named), list(self.cleared)) if self.changed else None


def encode_verdicts(verdicts: Sequence[Verdict]) -> bytes:
    body = [{"number": v.number, "named": [list(f) for f in v.named], "cleared": [list(f) for f in v.cleared],
             "changed": v.changed} for v in verdicts]
    return json.dumps(body, separators=(",", ":")).encode()


def decode_verdicts(data: bytes) -> list[Verdict]:
    """The verdicts of the key; ``[]`` when it is unreadable."""
    try:
        return [Verdict(int(v["number"]), [Finding(*f) for f in v["named"]], [Finding(*f) for f in v["cleared"]],
                        bool(v["changed"])) for v in json.loads(data)]
    except (ValueError, TypeError, KeyError):
        return []


class Judge:
    """The judging node's state: every node's intervals gathered, and the hysteresis."""

    def __init__(self, threshold: float) -> None:
        self.tracker = StragglerTracker(threshold)
        #: Every node's samples by interval number: what windows are made of.
        self.history: dict[int, list[RankSample]] = {}

    def take(self, intervals: Mapping[int, list[RankSample]], newest: int) -> Verdict | None:
        """Add ``intervals`` and judge the window ending at ``newest``; ``None``: nothing to judge yet."""
        self.history.update(intervals)
        for old in [n for n in self.history if n <= newest - MAX_INTERVALS]:
            del self.history[old]
        chosen = select_window(self.history, newest)
        if chosen is None:
            return None
        findings = judge(window(chosen))
        log.debug("straggler window of %d intervals: %s", len(chosen),
                  ", ".join(f"rank {f.rank} {f.ratio:.3f}{'' if f.holds_others else ' (holds none)'}"
                            for f in findings))
        change = self.tracker.update(findings)
        named = sorted(self.tracker.named.values(), key=lambda f: f.rank)
        return Verdict(newest, named, change.cleared if change is not None else [], change is not None)


class NodeExchange:
    """One node's share of an interval's exchange (see the module docstring)."""

    def __init__(self, run_id: str, round_: int, group_rank: int, world: int, threshold: float) -> None:
        self.group_rank = group_rank
        self.own_key = cluster.key(run_id, round_, group_rank)
        self.verdicts_key = verdicts_key(run_id, round_)
        self.judge = Judge(threshold) if group_rank == JUDGE else None
        #: Every node's key: only the judge reads them.
        self.keys = [cluster.key(run_id, round_, rank) for rank in range(world)] if self.judge is not None else []
        self._kept: list[Verdict] = []
        #: The newest verdict applied (``None`` before the first look).
        self._last: int | None = None

    def interval(self, store: KeyValueStore, number: int, local: Mapping[int, Sequence[RankSample]],
                 label: str) -> list[Verdict]:
        """Publish this node's summary of ``local`` at the end of interval ``number``; the verdicts
        new to this node, oldest first."""
        store.set(self.own_key, cluster.encode(label, local))
        if self._last is None:
            # Verdicts already in the key are an earlier attempt's (this one has judged nothing yet).
            self._last = number - 1
        if self.judge is None:
            if not store.check([self.verdicts_key]):
                return []
            fresh = [v for v in decode_verdicts(store.get(self.verdicts_key)) if v.number > self._last]
        else:
            # Judged one interval late: by now every node has published it.
            newest = number - 1
            wanted = [n for n in range(number - cluster.KEY_INTERVALS + 1, number) if n not in self.judge.history]
            intervals: dict[int, list[RankSample]] = {}
            if wanted and store.check(self.keys):
                intervals = cluster.gather(store.multi_get(self.keys), wanted)
            verdict = self.judge.take(intervals, newest)
            fresh = [verdict] if verdict is not None else []
            if verdict is not None:
                self._kept = [*self._kept, verdict][-VERDICTS_KEPT:]
                store.set(self.verdicts_key, encode_verdicts(self._kept))
        if fresh:
            self._last = fresh[-1].number
        return fresh
