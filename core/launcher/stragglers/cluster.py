"""Every node's timings, through the workers' store: one key per node, rewritten each interval.

Key ``launcher/stragglers/<run_id>/<round>/node/<group_rank>``: JSON
``{"node": label, "intervals": {"<interval>": [[rank, local_rank, span, wait, collectives, steps], ...]}}``
holding that node's last :data:`KEY_INTERVALS` intervals (numbered by wall-clock time divided by the interval, so
the nodes' numbers agree as their clocks do). Each interval a node writes its own key once; the judging
node reads every node's (one multi-get) and publishes the verdict (:mod:`launcher.stragglers.exchange`).

The judge judges the window that ended an interval *before* the one it just published, so every
other node has published it too. It keeps the intervals it gathered (a window may reach back
further than the key does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from launcher.stragglers.verdict import RankSample

#: Intervals each node's key holds: a node that missed a look catches up from them.
KEY_INTERVALS = 5


def key(run_id: str, round_: int, group_rank: int) -> str:
    return f"launcher/stragglers/{run_id}/{round_}/node/{group_rank}"


def encode(node: str, intervals: Mapping[int, Sequence[RankSample]]) -> bytes:
    """One node's summary of ``intervals`` (interval number: its ranks' samples)."""
    body = {
        "node": node,
        "intervals": {str(number): [[s.rank, s.local_rank, round(s.span, 4), round(s.wait, 4), s.collectives, s.steps]
                                    for s in samples] for number, samples in intervals.items()},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[int, list[RankSample]]:
    """A node's summary back into samples by interval number; ``{}`` when it is unreadable."""
    try:
        body = json.loads(data)
        node = str(body["node"])
        return {int(number): [RankSample(int(r), node, int(lr), float(span), float(wait), int(collectives), int(steps))
                              for r, lr, span, wait, collectives, steps in rows]
                for number, rows in body["intervals"].items()}
    except (ValueError, TypeError, KeyError):
        return {}


def gather(summaries: Sequence[bytes], numbers: Sequence[int]) -> dict[int, list[RankSample]]:
    """The samples of those of the intervals ``numbers`` that every node's summary holds (a node
    late, or gone, lacks the newest: that interval waits for the next look)."""
    decoded = [decode(data) for data in summaries]
    intervals = {}
    for number in numbers:
        if decoded and all(number in node for node in decoded):
            intervals[number] = [s for node in decoded for s in node[number]]
    return intervals
