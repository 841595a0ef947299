"""Records ``verdicts_3_nodes.json``: three nodes' samples, interval by interval, and the lines each
node printed under main's algorithm before issue 40 (every node read every node's key and judged).

Run once with main's ``core/`` (commit 8f3f8ef) first on ``PYTHONPATH``::

    PYTHONPATH=<main>/core python tests/stragglers/data/record_verdicts.py > tests/stragglers/data/verdicts_3_nodes.json
"""

from __future__ import annotations

import json
import random
import sys

from launcher.stragglers import cluster, report
from launcher.stragglers.verdict import MAX_INTERVALS, RankSample, StragglerTracker, judge, select_window, window

THRESHOLD = 1.15
NODES, PER_NODE = 3, 4


def interval(rnd: random.Random, slow: dict[int, float]) -> list[RankSample]:
    """A data-parallel job's interval (as tests/stragglers/test_verdict.py simulates it)."""
    ranks = NODES * PER_NODE
    work, wait, span, steps = [0.0] * ranks, [0.0] * ranks, 0.0, 0
    while span < 5.0:
        times = [0.1 * (1 + rnd.uniform(-0.1, 0.1)) * slow.get(r, 1.0) + 0.01 for r in range(ranks)]
        last = max(times)
        for r in range(ranks):
            work[r] += times[r]
            wait[r] += last - times[r] + 0.003
        span += last + 0.003
        steps += 1
    return [RankSample(r, f"node{r // PER_NODE}", r % PER_NODE, round(span, 4), round(wait[r], 4), steps, 0)
            for r in range(ranks)]


def main() -> None:
    rnd = random.Random(40)
    ticks = []
    for t in range(40):
        samples = interval(rnd, {5: 1.3} if 10 <= t < 25 else {})
        ticks.append([[list(s) for s in samples if s.rank // PER_NODE == node] for node in range(NODES)])
    # main's StragglerMonitor._run on every node, in step: every node publishes, then each reads and judges.
    keys: list[bytes] = [b""] * NODES
    locals_ = [{} for _ in range(NODES)]
    histories = [{} for _ in range(NODES)]
    trackers = [StragglerTracker(THRESHOLD) for _ in range(NODES)]
    lines: list[list[str]] = [[] for _ in range(NODES)]
    for t, per_node in enumerate(ticks):
        number = 100 + t
        for node in range(NODES):
            locals_[node][number] = [RankSample(*row) for row in per_node[node]]
            for old in [n for n in locals_[node] if n <= number - cluster.KEY_INTERVALS]:
                del locals_[node][old]
            keys[node] = cluster.encode(f"node{node}", locals_[node])
        for node in range(NODES):
            history = histories[node]
            newest = number - 1
            wanted = [n for n in range(number - cluster.KEY_INTERVALS + 1, number) if n not in history]
            if wanted:
                history.update(cluster.gather(keys, wanted))
            for old in [n for n in history if n <= newest - MAX_INTERVALS]:
                del history[old]
            chosen = select_window(history, newest)
            if chosen is None:
                continue
            change = trackers[node].update(judge(window(chosen)))
            if change is not None:
                lines[node] += report.change_lines(change, THRESHOLD)
    json.dump({"threshold": THRESHOLD, "first_number": 100, "ticks": ticks, "lines": lines}, sys.stdout)


if __name__ == "__main__":
    main()
