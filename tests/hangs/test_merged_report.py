"""One node merges the hang summaries, every node reads one key: main's report on recorded summaries, at O(1) a node."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from launcher.hangs import cluster
from launcher.hangs.report import HangReport, NodeSummary
from launcher.store.client import TCPStoreClient
from launcher.store.server import StoreServer
from launcher.testing import exchanges

RECORDED = Path(__file__).parent / "data" / "report_3_nodes.json"


@pytest.fixture
def server():
    with StoreServer("127.0.0.1", 0).start() as running:
        yield running


def _exchange_all(server: StoreServer, summaries: list[NodeSummary], tolerance: float, alarm: dict,
                  *, absent: set[int] = frozenset(), timeout: float = 30.0, run: str = "rec") -> list[HangReport]:
    """Every node (but those ``absent``) on a thread of its own, as HangMonitor._diagnose: exchange, then its report."""
    world = len(summaries)
    reports: list[HangReport | None] = [None] * world
    errors: list[BaseException] = []

    def node(i: int) -> None:
        try:
            with TCPStoreClient(server.host, server.port, timeout=timeout + 10.0) as store:
                nodes, missing, omitted, reason = cluster.exchange(store, cluster.prefix(run, 0), summaries[i],
                                                                   world, tolerance=tolerance, timeout=timeout)
            report = HangReport(alarm["node"], alarm["reason"], nodes, missing, tolerance=tolerance, omitted=omitted)
            report.reason = reason or report.culprit_reason() or report.reason
            reports[i] = report
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(world) if i not in absent]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return [r for r in reports if r is not None]


def test_every_node_prints_mains_report_on_recorded_summaries(server) -> None:
    # Recorded by data/record_report.py under main's algorithm (every node read every summary).
    recorded = json.loads(RECORDED.read_text())
    summaries = [NodeSummary.from_dict(item) for item in recorded["summaries"]]
    reports = _exchange_all(server, summaries, recorded["tolerance"], recorded["alarm"])
    assert len(reports) == 3
    for report in reports:
        assert report.render() == recorded["render"]


def test_a_report_too_big_keeps_the_culprits_nodes_and_says_so(server) -> None:
    summaries = [exchanges._summary(i) for i in range(40)]  # 320 ranks: more than MERGED_LIMIT for every node
    alarm = {"node": summaries[5].node, "reason": "rank 40 (local rank 0): no heartbeat"}
    reports = _exchange_all(server, summaries, 2.5, alarm)
    whole = reports[cluster.MERGER]
    assert whole.omitted == 0 and len(whole.nodes) == 40
    assert "rank 3 (local rank 3)" in whole.reason  # the odd one out: not in a collective
    for report in reports[1:]:
        assert report.reason == whole.reason and report.omitted > 0
        assert len(report.nodes) <= cluster.MERGED_CULPRITS + 2  # the merger's, the culprits', its own
        assert [e.rank for e in report.hung_ranks][:1] == [3]
        assert f"{report.omitted} other node(s) left out here" in report.render()


def test_without_the_merging_node_the_backup_merges_and_without_both_a_node_reports_its_own(server) -> None:
    recorded = json.loads(RECORDED.read_text())
    summaries = [NodeSummary.from_dict(item) for item in recorded["summaries"]]
    reports = _exchange_all(server, summaries, recorded["tolerance"], recorded["alarm"], absent={cluster.MERGER},
                            timeout=0.5)
    assert [[n.group_rank for n in r.nodes] for r in reports] == [[1, 2], [1, 2]]
    assert reports[0].missing == reports[1].missing == [cluster.MERGER]
    assert reports[0].render() == reports[1].render()
    alone = _exchange_all(server, summaries, recorded["tolerance"], recorded["alarm"],
                          absent={cluster.MERGER, cluster.BACKUP_MERGER}, timeout=0.5, run="alone")
    assert [n.group_rank for n in alone[0].nodes] == [2] and alone[0].missing == [0, 1]
    assert "No answer from node(s) with group rank 0-1" in alone[0].render()


def test_each_node_costs_the_same_at_50_and_200_nodes(server) -> None:
    small = exchanges.hangs(server, 50)
    large = exchanges.hangs(server, 200)
    assert large.node_requests == pytest.approx(small.node_requests, abs=0.1)
    assert large.node_bytes == pytest.approx(small.node_bytes, rel=0.05) and large.node_bytes <= cluster.MERGED_LIMIT
    # The merging node reads every summary: the store host's share grows linearly.
    assert large.judge_requests > 3 * small.judge_requests
    assert large.total_bytes == pytest.approx(4 * small.total_bytes, rel=0.2)
