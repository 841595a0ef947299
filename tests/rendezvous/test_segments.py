"""--segment N through real rendezvous rounds (simulated nodes over a store): whole segments of one
domain train, the other nodes wait as spares, and a lost node's place goes to a spare of its own
domain (issue 47; the closer's choice itself is tested in tests/topology/test_segments.py)."""

from __future__ import annotations

import json
import logging

import pytest
from launcher.rendezvous.dynamic import DynamicRendezvousHandler
from launcher.rendezvous.keys import RendezvousKeys
from launcher.topology.api import NodeLocation

from .conftest import PROMPT, Cluster, Pending, wait_for

SPARE = "waiting as a spare"


def placed(cluster: Cluster, run: str, leaf: str) -> DynamicRendezvousHandler:
    handler = cluster.node(run, 2, 2, join_timeout=30, last_call_timeout=15)
    handler.topology = NodeLocation(("spine0", leaf))
    handler.segment = 2
    return handler


def test_a_segment_trains_the_rest_wait_and_a_spare_of_the_lost_nodes_leaf_replaces_it(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="launcher.rendezvous")
    run = cluster.run_id()
    # leaf-a sorts first, but its first node alone is no segment: leaf-b's two nodes complete one
    # and close the round at once (MAX in whole segments), without waiting for the last call.
    a1, b1 = placed(cluster, run, "leaf-a"), placed(cluster, run, "leaf-b")
    first = [Pending(a1), Pending(b1)]
    assert wait_for(lambda: caplog.text.count("joined round 0") == 2, PROMPT), caplog.text
    b2 = placed(cluster, run, "leaf-b")
    training = [first[1], Pending(b2)]
    infos = [p.result() for p in training]
    assert sorted(i.group_rank for i in infos) == [0, 1] and {i.group_world_size for i in infos} == {2}
    assert wait_for(lambda: SPARE in caplog.text, PROMPT), caplog.text
    assert not first[0].done(), first[0].error  # a1: left out of the round, a spare
    # Two more arrive once the round is closed: spares as well (leaf-a now could make a segment).
    a2, b3 = placed(cluster, run, "leaf-a"), placed(cluster, run, "leaf-b")
    late = [Pending(a2), Pending(b3)]
    assert wait_for(lambda: caplog.text.count(SPARE) == 3, PROMPT), caplog.text
    assert b1.num_nodes_waiting() == 0, "spares must not make the round re-form"
    assert b1.spares_waiting == 3

    # b2 is lost: the survivor b1 re-forms with b3, the spare of its own leaf, though leaf-a (a1,
    # a2: a whole segment too) sorts first.
    cluster.sever(b2)
    assert wait_for(lambda: bool(b1.lost_nodes()), PROMPT)
    again = Pending(b1)
    infos = [again.result(), late[1].result()]
    assert {i.round for i in infos} == {1}
    assert sorted(infos[0].participants) == sorted([b1.node.id, b3.node.id])
    assert not first[0].done() and not late[0].done(), "leaf-a's nodes stay spares"


def test_without_min_in_whole_segments_the_round_waits_then_times_out_saying_so(cluster: Cluster) -> None:
    # MIN 2 nodes joined, but on two leaves: no whole segment, so no round (not one of two leaves).
    run = cluster.run_id()
    nodes = []
    for leaf in ("leaf-a", "leaf-b"):
        handler = cluster.node(run, 2, 2, join_timeout=2, last_call_timeout=0.3)
        handler.topology = NodeLocation(("spine0", leaf))
        handler.segment = 2
        nodes.append(Pending(handler))
    errors = [str(p.exception()) for p in nodes]
    assert any("2 of 2 required nodes joined round 0" in e and "which make 0 whole segment(s) of 2 nodes" in e
               for e in errors), errors


def test_a_straggler_is_put_out_only_when_a_spare_can_fill_its_segment(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """--segment: a spare of another domain that completes no segment is no replacement (the job
    would wait instead of training), so put_out refuses; one of the node's own domain, or spares
    that make a whole segment elsewhere, let it go, and the round re-forms by whole segments."""
    caplog.set_level(logging.INFO, logger="launcher.rendezvous")
    run = cluster.run_id()
    a1, a2 = placed(cluster, run, "leaf-a"), placed(cluster, run, "leaf-a")
    training = [Pending(a1), Pending(a2)]
    assert sorted(p.result().group_rank for p in training) == [0, 1]
    b1 = placed(cluster, run, "leaf-b")  # arrives once the round is closed: a spare of another leaf
    spares = [Pending(b1)]
    assert wait_for(lambda: caplog.text.count(SPARE) == 1, PROMPT), caplog.text
    assert wait_for(lambda: a1.put_out(a2.node.id, "straggler: x", publish=False) is not None, PROMPT)
    refused = a1.put_out(a2.node.id, "straggler: x", publish=False)
    assert refused == ("the job would fall below its 2 nodes minimum: --segment 2 needs a spare of its domain "
                       "spine0.leaf-a, and the 1 spare(s) waiting with a known domain make no whole segment"), refused
    assert a2.put_out(a2.node.id, "straggler: x") == refused and a1.lost_nodes() == []  # nothing published

    # A second spare of leaf-b: the two make a whole segment, which can take the job's place.
    b2 = placed(cluster, run, "leaf-b")
    spares.append(Pending(b2))
    assert wait_for(lambda: a1.put_out(a2.node.id, "straggler: x", publish=False) is None, PROMPT), caplog.text
    assert a1.put_out(a2.node.id, "straggler: x") is None
    again = Pending(a1)
    infos = [p.result() for p in spares]
    assert {i.round for i in infos} == {1}
    assert sorted(infos[0].participants) == sorted([b1.node.id, b2.node.id])  # leaf-a's survivor: a spare
    assert not again.done()


def test_a_spare_of_the_stragglers_own_domain_lets_it_be_put_out(cluster: Cluster,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="launcher.rendezvous")
    run = cluster.run_id()
    a1, a2 = placed(cluster, run, "leaf-a"), placed(cluster, run, "leaf-a")
    assert sorted(p.result().group_rank for p in [Pending(a1), Pending(a2)]) == [0, 1]
    b1, a3 = placed(cluster, run, "leaf-b"), placed(cluster, run, "leaf-a")
    spares = [Pending(b1), Pending(a3)]
    assert wait_for(lambda: caplog.text.count(SPARE) == 2, PROMPT), caplog.text
    assert wait_for(lambda: a1.put_out(a2.node.id, "straggler: x", publish=False) is None, PROMPT), caplog.text
    assert a1.put_out(a2.node.id, "straggler: x") is None
    again = Pending(a1)
    info = again.result()
    assert info.round == 1 and sorted(info.participants) == sorted([a1.node.id, a3.node.id])
    assert spares[1].result().round == 1 and not spares[0].done()  # leaf-b's node stays a spare


def elastic(cluster: Cluster, run: str, leaf: str) -> DynamicRendezvousHandler:
    """--nnodes 2:4 --segment 2: below MAX, the closer counts whole segments in the records."""
    handler = cluster.node(run, 2, 4, join_timeout=30, last_call_timeout=0.3)
    handler.topology = NodeLocation(("spine0", leaf))
    handler.segment = 2
    return handler


def closer_checks(cluster: Cluster, run: str) -> int:
    """How many times round 0's closer found too few nodes in whole segments (``<r>/checks``)."""
    store = cluster.service.connect()
    try:
        key = RendezvousKeys(run).checks(0)
        return int(json.loads(store.get(key))["n"]) if store.check([key]) else 0
    finally:
        store.close()


@pytest.mark.parametrize("closer_dies", [False, True], ids=["closer-lives", "closer-dies"])
def test_below_max_the_round_waits_for_min_in_whole_segments_and_a_backup_closes_it_if_the_closer_dies(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, closer_dies: bool
) -> None:
    caplog.set_level(logging.INFO, logger="launcher.rendezvous")
    run = cluster.run_id()
    a1 = elastic(cluster, run, "leaf-a")
    first = [Pending(a1)]
    assert wait_for(lambda: caplog.text.count("joined round 0") == 1, PROMPT), caplog.text
    b1 = elastic(cluster, run, "leaf-b")  # join index 2, MIN: the closer
    first.append(Pending(b1))
    # MIN nodes, no whole segment: the closer counts, finds none, and waits on (and on).
    assert wait_for(lambda: closer_checks(cluster, run) >= 2, PROMPT), caplog.text
    if closer_dies:
        cluster.sever(b1)
    a2 = elastic(cluster, run, "leaf-a")  # index 3: a backup closer; leaf-a now holds a segment
    info = Pending(a2).result()
    assert info.round == 0 and sorted(info.participants) == sorted([a1.node.id, a2.node.id])
    assert first[0].result().round == 0
    if not closer_dies:
        assert wait_for(lambda: SPARE in caplog.text, PROMPT), caplog.text  # b1 closed it: now a spare
        assert not first[1].done()


def test_a_node_that_times_out_takes_the_closers_count_rather_than_reading_every_record(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Below MAX, nodes that time out do not each read every joined record (O(N) apiece, all at
    once at scale): the closer has counted at each last call, and its last count decides."""
    caplog.set_level(logging.INFO, logger="launcher.rendezvous")
    run = cluster.run_id()
    nodes, pending = [], []
    for number, leaf in enumerate(("leaf-a", "leaf-b", "leaf-c"), start=1):  # no two on one leaf
        handler = cluster.node(run, 2, 8, join_timeout=4, last_call_timeout=0.3)
        handler.topology = NodeLocation(("spine0", leaf))
        handler.segment = 2
        nodes.append(handler)
        pending.append(Pending(handler))
        assert wait_for(lambda n=number: caplog.text.count("joined round 0") == n, PROMPT), caplog.text
    first = str(pending[0].exception())  # join index 1: the first to time out; index 2 is the closer
    assert "3 of 2 required nodes joined round 0" in first, first
    assert "which make 0 whole segment(s) of 2 nodes of one domain (0 nodes; --segment 2 needs 2)" in first, first
    assert cluster.stores[id(nodes[0])].calls["multi_get"] == 0  # the closer's count, not the records
    assert cluster.stores[id(nodes[1])].calls["multi_get"] >= 1  # the closer read them at its checks
    for other in pending[1:]:
        assert "timed out" in str(other.exception())
