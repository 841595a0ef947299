"""One node judges, every node reads its verdicts: main's verdicts on recorded samples, at O(1) a node."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
from launcher.store.client import TCPStoreClient
from launcher.store.server import StoreServer
from launcher.stragglers import report
from launcher.stragglers.exchange import (
    JUDGE,
    VERDICTS_KEPT,
    NodeExchange,
    Verdict,
    decode_verdicts,
    encode_verdicts,
    verdicts_key,
)
from launcher.stragglers.verdict import RankSample, _Medians
from launcher.testing import exchanges

RECORDED = Path(__file__).parent / "data" / "verdicts_3_nodes.json"


@pytest.fixture
def server():
    with StoreServer("127.0.0.1", 0).start() as running:
        yield running


def test_every_node_prints_mains_lines_on_recorded_samples(server) -> None:
    # Recorded by data/record_verdicts.py under main's algorithm (every node judged every key).
    recorded = json.loads(RECORDED.read_text())
    threshold, ticks = recorded["threshold"], recorded["ticks"]
    nodes = len(recorded["lines"])
    exchange = [NodeExchange("rec", 0, i, nodes, threshold) for i in range(nodes)]
    stores = [TCPStoreClient(server.host, server.port, timeout=10.0) for _ in range(nodes)]
    locals_: list[dict[int, list[RankSample]]] = [{} for _ in range(nodes)]
    lines: list[list[str]] = [[] for _ in range(nodes)]
    try:
        # One more tick than recorded: the nodes that read before the judge wrote catch up.
        for t in range(len(ticks) + 1):
            number = recorded["first_number"] + t
            # The judge last: the others read the verdicts it wrote a tick before (the latest case).
            for node in sorted(range(nodes), key=lambda i: i == JUDGE):
                if t == len(ticks) and node == JUDGE:
                    continue
                local = locals_[node]
                local[number] = [RankSample(*row) for row in ticks[min(t, len(ticks) - 1)][node]]
                for old in [n for n in local if n <= number - 5]:
                    del local[old]
                for verdict in exchange[node].interval(stores[node], number, local, f"node{node}"):
                    change = verdict.change()
                    if change is not None:
                        lines[node] += report.change_lines(change, threshold)
    finally:
        for store in stores:
            store.close()
    assert lines[JUDGE] and "straggler cleared" in lines[JUDGE][-1]
    assert lines == recorded["lines"]


def test_verdicts_round_trip_and_a_later_attempt_ignores_older_ones(server) -> None:
    recorded = json.loads(RECORDED.read_text())
    samples = [RankSample(*row) for row in recorded["ticks"][0][0]]
    assert decode_verdicts(encode_verdicts([Verdict(7, [], [], False)])) == [Verdict(7, [], [], False)]
    assert decode_verdicts(b"not json") == []
    with TCPStoreClient(server.host, server.port, timeout=10.0) as store:
        # An earlier attempt's verdicts of the same round are still in the key.
        store.set(verdicts_key("old", 0), encode_verdicts([Verdict(n, [], [], True) for n in range(40, 45)]))
        node = NodeExchange("old", 0, 1, 2, 1.15)
        assert node.interval(store, 46, {46: samples}, "node1") == []
        store.set(verdicts_key("old", 0), encode_verdicts([Verdict(47, [], [], True)]))
        assert [v.number for v in node.interval(store, 48, {48: samples}, "node1")] == [47]
    assert VERDICTS_KEPT >= 2


def test_each_node_costs_the_same_at_50_and_200_nodes(server) -> None:
    small = exchanges.stragglers(server, 50)
    large = exchanges.stragglers(server, 200)
    assert small.node_requests == large.node_requests <= 4
    assert large.node_bytes == pytest.approx(small.node_bytes, rel=0.05)
    # The judge reads every node's key: its share grows with the nodes, and the store host's linearly.
    assert large.judge_bytes > 3 * small.judge_bytes
    assert large.total_bytes == pytest.approx(4 * small.total_bytes, rel=0.2)


@pytest.mark.parametrize("count", [2, 3, 4, 9, 64])
def test_the_median_of_the_others_is_statistics_median_of_them(count: int) -> None:
    # The judge's O(log n) median of the others: the very number main computed (statistics.median).
    rnd = random.Random(count)
    for _ in range(50):
        values = [rnd.choice([0.25, 0.5, rnd.random(), rnd.random() * 1e-4]) for _ in range(count)]
        medians = _Medians(values)
        for i, value in enumerate(values):
            assert medians.without(value) == statistics.median(values[:i] + values[i + 1:])
