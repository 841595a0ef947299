"""Records ``report_3_nodes.json``: three nodes' hang summaries and the report every node printed
under main's algorithm before issue 40 (every node read every node's summary).

Run once with main's ``core/`` (commit 8f3f8ef) first on ``PYTHONPATH``::

    PYTHONPATH=<main>/core python tests/hangs/data/record_report.py > tests/hangs/data/report_3_nodes.json
"""

from __future__ import annotations

import json
import sys

from launcher.hangs.report import HangReport, NodeSummary, RankEntry

#: The multi-node monitor's tolerance: a check interval of 1 s, the dump slack, the alarm interval.
TOLERANCE = 2.5
STACK = "all_reduce (distributed_c10d.py:2806) <- train_step (train.py:42) <- main (train.py:50)"


def summaries() -> list[NodeSummary]:
    nodes = []
    for node in range(3):
        label = f"10.0.0.{node + 1}_4242{node}_0"
        entries = []
        for local in range(4):
            rank = node * 4 + local
            stuck = rank == 6
            age = 31.2 + 0.01 * rank if not stuck else 31.9
            entries.append(RankEntry(
                rank=rank, local_rank=local, node=label, pid=5000 + rank, age=round(age, 3), hung=rank != 11,
                summary="read (loader.py:88) <- next_batch (train.py:30) <- main (train.py:50)" if stuck else
                ("(exited)" if rank == 11 else STACK),
                reason=f"no heartbeat for {age:.1f} s (timeout 30 s)" if rank != 11 else "",
                collective=not stuck and rank != 11))
        nodes.append(NodeSummary(label, node, entries, stacks_file=f"/logs/job/hang_stacks_attempt_0.txt.{node}"))
    return nodes


def main() -> None:
    nodes = summaries()
    alarm = {"node": nodes[1].node, "reason": "rank 4 (local rank 0): no heartbeat for 31.2 s (timeout 30 s)"}
    # main's HangMonitor._diagnose: the summaries in group-rank order, the culprit's reason.
    report = HangReport(alarm["node"], alarm["reason"], nodes, missing=[], tolerance=TOLERANCE)
    report.reason = report.culprit_reason() or report.reason
    json.dump({"tolerance": TOLERANCE, "alarm": alarm, "summaries": [n.to_dict(full=False) for n in nodes],
               "render": report.render()}, sys.stdout)


if __name__ == "__main__":
    main()
