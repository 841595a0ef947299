"""The core's rendezvous algorithm with simulated nodes (threads) over one store."""

from __future__ import annotations

import json
import logging
import time

import pytest
from launcher.agent.membership import lost_since
from launcher.rendezvous.api import (
    SMALL_ROUND_MAX,
    RendezvousClosedError,
    RendezvousConfigError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from launcher.rendezvous.dynamic import KEY_ROOT, DynamicRendezvousHandler, handler_over_store
from launcher.rendezvous.membership import sealed_summary

from .conftest import FAST, PROMPT, Cluster, Pending, rendezvous_all, wait_for

pytestmark = pytest.mark.timeout(60)


def _order(handler: DynamicRendezvousHandler) -> tuple[str, int, int]:
    node = handler.node
    return (node.addr, node.pid, node.local_id)


# -- forming a round ------------------------------------------------------------------------------


def test_fixed_size_round_gives_deterministic_ranks(cluster: Cluster) -> None:
    run = cluster.run_id()
    # Addresses that sort in the opposite order of creation: ranks follow the sort, not arrival.
    handlers = [cluster.node(run, 4, 4, local_addr=f"10.0.0.{9 - i}") for i in range(4)]
    infos = rendezvous_all(handlers)
    assert sorted(info.group_rank for info in infos) == [0, 1, 2, 3]
    assert {info.group_world_size for info in infos} == {4}
    assert {info.round for info in infos} == {0}
    expected = [h.node.id for h in sorted(handlers, key=_order)]
    for handler, info in zip(handlers, infos, strict=True):
        assert info.participants == expected
        assert info.participants[info.group_rank] == handler.node.id
    assert handlers[-1] is sorted(handlers, key=_order)[0]


def test_round_closes_at_max_without_waiting_for_last_call(cluster: Cluster) -> None:
    run = cluster.run_id()
    handlers = cluster.nodes(3, run, 1, 3, last_call_timeout=60)
    started = time.monotonic()
    infos = rendezvous_all(handlers)
    assert time.monotonic() - started < 10
    assert {info.group_world_size for info in infos} == {3}


def test_round_closes_after_last_call_with_min_nodes(cluster: Cluster) -> None:
    run = cluster.run_id()
    handlers = cluster.nodes(2, run, 2, 4, last_call_timeout=0.6)
    started = time.monotonic()
    infos = rendezvous_all(handlers)
    elapsed = time.monotonic() - started
    assert {info.group_world_size for info in infos} == {2}
    assert 0.5 <= elapsed < 10, f"closing took {elapsed:.2f} s; last call is 0.6 s"


def test_round_store_is_shared_and_separate_per_round(cluster: Cluster) -> None:
    run = cluster.run_id()
    handlers = cluster.nodes(2, run, 2, 2)
    first = rendezvous_all(handlers)
    stores = [info.store for info in first]
    assert stores[0] is not None and stores[1] is not None
    stores[0].set("barrier", b"x")
    assert stores[1].get("barrier", timeout=5) == b"x"
    assert stores[1].add("count", 2) == 2
    second = rendezvous_all(handlers)
    assert second[0].store is not None
    assert not second[0].store.check(["barrier"]), "a new round must start with a clean agent store"


def test_local_world_sizes_come_back_in_rank_order(cluster: Cluster) -> None:
    run = cluster.run_id()
    handlers = cluster.nodes(3, run, 3, 3)
    for size, handler in enumerate(handlers, start=1):
        handler.local_world_size = size
    infos = rendezvous_all(handlers)
    sizes = {h.node.id: n for n, h in enumerate(handlers, start=1)}
    assert infos[0].local_world_sizes == [sizes[node] for node in infos[0].participants]


def test_workers_store_given_by_the_backend(cluster: Cluster) -> None:
    run = cluster.run_id()
    handlers = cluster.nodes(2, run, 2, 2, master_addr="10.1.2.3", master_port=4567)
    infos = rendezvous_all(handlers)
    assert {(i.master_addr, i.master_port, i.use_agent_store) for i in infos} == {("10.1.2.3", 4567, True)}


def test_workers_store_served_by_rank_0s_agent(cluster: Cluster) -> None:
    import socket

    run = cluster.run_id()
    infos = rendezvous_all(cluster.nodes(3, run, 3, 3))
    assert len({(i.master_addr, i.master_port) for i in infos}) == 1
    assert infos[0].master_addr == "127.0.0.1"
    assert 0 < infos[0].master_port < 65536
    assert all(i.use_agent_store for i in infos)
    with socket.create_connection((infos[0].master_addr, infos[0].master_port), timeout=5):
        pass  # listening already: the workers never race the agent for it


# -- elastic membership ---------------------------------------------------------------------------


def test_late_node_is_waiting_then_joins_the_next_round(cluster: Cluster) -> None:
    run = cluster.run_id()
    first, second = cluster.nodes(2, run, 2, 3, last_call_timeout=0.3)
    before = rendezvous_all([first, second])
    assert [i.group_world_size for i in before] == [2, 2]
    assert first.num_nodes_waiting() == 0
    late = Pending(cluster.node(run, 2, 3, last_call_timeout=0.3))
    assert wait_for(lambda: first.num_nodes_waiting() == 1 and second.num_nodes_waiting() == 1, PROMPT)
    assert not late.done()
    after = rendezvous_all([first, second])
    joined = late.result()
    assert sorted(i.group_rank for i in [*after, joined]) == [0, 1, 2]
    assert {i.round for i in [*after, joined]} == {1}
    assert {i.group_world_size for i in [*after, joined]} == {3}


def test_extra_node_beyond_max_is_not_counted_and_leaves_on_close(cluster: Cluster) -> None:
    run = cluster.run_id()
    members = cluster.nodes(2, run, 2, 2)
    rendezvous_all(members)
    extra = Pending(cluster.node(run, 2, 2))
    time.sleep(0.5)
    # The round is full: restarting for this node would not admit it.
    assert members[0].num_nodes_waiting() == 0
    assert not extra.done()
    members[0].set_closed()
    assert isinstance(extra.exception(), RendezvousClosedError)


def test_restart_of_one_node_is_seen_by_the_others(cluster: Cluster) -> None:
    run = cluster.run_id()
    a, b = cluster.nodes(2, run, 2, 2)
    rendezvous_all([a, b])
    restarting = Pending(a)
    assert wait_for(lambda: b.num_nodes_waiting() >= 1, PROMPT), "b was not told that a re-joins"
    info_b = b.next_rendezvous()
    info_a = restarting.result()
    assert info_a.round == info_b.round == 1
    assert sorted([info_a.group_rank, info_b.group_rank]) == [0, 1]
    assert a.num_nodes_waiting() == b.num_nodes_waiting() == 0


def test_a_round_names_who_left_the_round_before_without_a_roster_read(cluster: Cluster) -> None:
    run = cluster.run_id()
    # A heartbeat timeout no loaded machine reaches: a node reported lost would read the roster.
    handlers = cluster.nodes(3, run, 2, 3, heartbeat_timeout=30.0, keep_alive_interval=1.0)
    before = rendezvous_all(handlers)
    assert {(i.left, i.left_count) for i in before} == {(None, 0)}  # round 0: no round before it
    gone = handlers[2]
    gone.shutdown()
    after = rendezvous_all(handlers[:2])
    assert [(i.round, i.group_world_size) for i in after] == [(1, 2), (1, 2)]
    assert [(list(i.left or []), i.left_count) for i in after] == [([gone.node.id], 1)] * 2
    for old, new in zip(before, after, strict=False):  # the first two: the ones that rejoined
        assert lost_since(old, new) == ([gone.node.id], 0)
        assert not new.participants.loaded  # type: ignore[attr-defined]  # named from `sealed` alone
    # A round whose node missed the one before compares both lists.
    skipped = RendezvousInfo(None, 0, 3, "", 0, round=after[0].round - 2, participants=["x", *after[0].participants])
    assert lost_since(skipped, after[0]) == (["x"], 0)


def test_sealed_names_at_most_so_many_of_the_nodes_that_left() -> None:
    previous = [f"n{i}" for i in range(SMALL_ROUND_MAX + 10)]
    summary = sealed_summary({"ids": ["n0", "kept"], "count": 2, "hr": None}, previous)
    assert summary["nleft"] == SMALL_ROUND_MAX + 9
    assert summary["left"] == previous[1 : SMALL_ROUND_MAX + 1]
    assert "left" not in sealed_summary({"ids": ["n0"], "count": 1, "hr": None})
    info = RendezvousInfo(None, 0, 2, "", 0, round=1, left=summary["left"], left_count=summary["nleft"])
    names, unnamed = lost_since(RendezvousInfo(None, 0, 3, "", 0, round=0), info)
    assert (len(names), unnamed) == (SMALL_ROUND_MAX, 9)


def test_node_that_took_an_index_but_died_is_left_out(cluster: Cluster) -> None:
    run = cluster.run_id()
    probe = cluster.service.connect()
    # A "node" that took join index 1 and died before announcing itself.
    probe.compare_set(f"{KEY_ROOT}/{run}/current", b"", b"0")
    assert probe.add(f"{KEY_ROOT}/{run}/0/seq", 1) == 1
    handlers = cluster.nodes(2, run, 2, 3, read_timeout=1.0, master_addr="127.0.0.1", master_port=1)
    started = time.monotonic()
    infos = rendezvous_all(handlers)
    assert time.monotonic() - started < 10
    assert {i.group_world_size for i in infos} == {2}


def test_another_node_closes_the_round_when_the_closer_dies(cluster: Cluster) -> None:
    run = cluster.run_id()
    probe = cluster.service.connect()
    # A node joined first (so it is the one to close after last call, MIN being 1) and died.
    probe.compare_set(f"{KEY_ROOT}/{run}/current", b"", b"0")
    assert probe.add(f"{KEY_ROOT}/{run}/0/seq", 1) == 1
    record = {"id": "dead_1_0", "addr": "dead", "pid": 1, "lid": 0, "host": False, "r0": False, "lws": None}
    probe.set(f"{KEY_ROOT}/{run}/0/node/1", json.dumps(record).encode())
    handlers = cluster.nodes(2, run, 1, 4, last_call_timeout=0.4, progress_interval=0.2)
    started = time.monotonic()
    infos = rendezvous_all(handlers)
    assert {i.group_world_size for i in infos} == {3}
    assert time.monotonic() - started < 10


# -- liveness -------------------------------------------------------------------------------------


def test_silent_node_is_reported_lost_within_the_heartbeat_timeout(cluster: Cluster) -> None:
    run = cluster.run_id()
    handlers = cluster.nodes(3, run, 3, 3)
    infos = rendezvous_all(handlers)
    time.sleep(2 * FAST["heartbeat_timeout"])
    assert [h.lost_nodes() for h in handlers] == [[], [], []], "a healthy node was reported lost"
    victim = next(h for h, info in zip(handlers, infos, strict=True) if info.group_rank == 1)
    survivors = [h for h in handlers if h is not victim]
    cluster.sever(victim)
    silenced = time.monotonic()
    # Detection: the timeout plus two watcher ticks; the rest is slack for a loaded machine.
    limit = FAST["heartbeat_timeout"] + 2.0
    assert wait_for(lambda: all(h.lost_nodes() for h in survivors), limit + 2)
    elapsed = time.monotonic() - silenced
    assert elapsed <= limit, f"reported after {elapsed:.2f} s"
    assert [h.lost_nodes() for h in survivors] == [[victim.node.id]] * 2


def test_two_adjacent_silent_nodes_are_both_reported(cluster: Cluster) -> None:
    run = cluster.run_id()
    handlers = cluster.nodes(4, run, 4, 4)
    infos = rendezvous_all(handlers)
    by_rank = {info.group_rank: h for h, info in zip(handlers, infos, strict=True)}
    for rank in (1, 2):  # rank 0 watches 1, which watched 2: the ring must close around both
        cluster.sever(by_rank[rank])
    expected = {by_rank[1].node.id, by_rank[2].node.id}
    assert wait_for(lambda: set(by_rank[0].lost_nodes()) == expected, 3 * FAST["heartbeat_timeout"] + 3)
    assert wait_for(lambda: set(by_rank[3].lost_nodes()) == expected, 2)


def test_node_that_shuts_down_is_not_lost(cluster: Cluster) -> None:
    run = cluster.run_id()
    handlers = cluster.nodes(3, run, 3, 3)
    rendezvous_all(handlers)
    handlers[1].shutdown()
    time.sleep(2 * FAST["heartbeat_timeout"] + 0.5)
    assert handlers[0].lost_nodes() == [] and handlers[2].lost_nodes() == []


# -- closing, timeouts ----------------------------------------------------------------------------


def test_closed_rendezvous_turns_late_nodes_away(cluster: Cluster) -> None:
    run = cluster.run_id()
    a, b = cluster.nodes(2, run, 2, 2)
    rendezvous_all([a, b])
    assert not b.is_closed()
    a.set_closed()
    assert a.is_closed() and b.is_closed()
    started = time.monotonic()
    with pytest.raises(RendezvousClosedError):
        cluster.node(run, 2, 2).next_rendezvous()
    with pytest.raises(RendezvousClosedError):
        b.next_rendezvous()
    assert time.monotonic() - started < 10


def test_closing_wakes_nodes_waiting_for_a_round(cluster: Cluster) -> None:
    run = cluster.run_id()
    waiting = Pending(cluster.node(run, 3, 3))
    time.sleep(0.3)
    cluster.node(run, 3, 3).set_closed()
    assert isinstance(waiting.exception(5), RendezvousClosedError)


def test_join_timeout_says_how_many_joined(cluster: Cluster) -> None:
    run = cluster.run_id()
    handler = cluster.node(run, 3, 5, join_timeout=0.8)
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError) as caught:
        handler.next_rendezvous()
    assert 0.7 <= time.monotonic() - started < 10
    assert "1 of 3 required nodes joined" in str(caught.value)
    assert "--nnodes 3:5" in str(caught.value)


def test_join_timeout_names_the_missing_nodes(cluster: Cluster) -> None:
    run = cluster.run_id()
    a, b = cluster.nodes(2, run, 2, 2, join_timeout=1.0)
    rendezvous_all([a, b])
    cluster.sever(b)
    with pytest.raises(RendezvousTimeoutError) as caught:
        a.next_rendezvous()
    assert f"missing since round 0: {b.node.id}" in str(caught.value)


def test_round_after_a_timeout_still_forms(cluster: Cluster) -> None:
    run = cluster.run_id()
    with pytest.raises(RendezvousTimeoutError):
        cluster.node(run, 2, 2, join_timeout=0.5).next_rendezvous()
    infos = rendezvous_all(cluster.nodes(2, run, 2, 2))
    assert sorted(i.group_rank for i in infos) == [0, 1]


def test_progress_messages_while_waiting(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    run = cluster.run_id()
    a, b = cluster.nodes(2, run, 2, 2, progress_interval=0.2, join_timeout=1.0)
    rendezvous_all([a, b])
    cluster.sever(b)
    with caplog.at_level(logging.INFO, logger="launcher.rendezvous"), pytest.raises(RendezvousTimeoutError):
        a.next_rendezvous()
    progress = [r.getMessage() for r in caplog.records if "waiting for nodes" in r.getMessage()]
    assert progress, "no progress message while waiting"
    assert "1 joined of min 2 (max 2)" in progress[0]
    assert f"missing: {b.node.id}" in progress[0]
    assert "timeout in" in progress[0]


# -- isolation, rank 0 ----------------------------------------------------------------------------


def test_run_ids_do_not_mix(cluster: Cluster) -> None:
    base = cluster.run_id()
    runs = [base, base + "1", base + "/1"]  # prefixes of one another, on purpose
    handlers = {run: cluster.nodes(2, run, 2, 2) for run in runs}
    everyone = [h for run in runs for h in handlers[run]]
    infos = dict(zip(map(id, everyone), rendezvous_all(everyone), strict=True))
    for run in runs:
        mine = [infos[id(h)] for h in handlers[run]]
        assert sorted(i.group_rank for i in mine) == [0, 1]
        assert set(mine[0].participants) == {h.node.id for h in handlers[run]}
    handlers[base][0].set_closed()
    assert not handlers[runs[1]][0].is_closed() and not handlers[runs[2]][0].is_closed()


def test_stable_rank0_keeps_the_store_host_first(cluster: Cluster) -> None:
    run = cluster.run_id()
    others = cluster.nodes(2, run, 3, 3, local_addr="10.0.0.1", stable_rank0=True)
    host = cluster.node(run, 3, 3, local_addr="10.0.0.9", is_host=True, stable_rank0=True)
    infos = dict(zip(map(id, [*others, host]), rendezvous_all([*others, host]), strict=True))
    assert infos[id(host)].group_rank == 0


def test_without_stable_rank0_the_host_takes_its_sorted_place(cluster: Cluster) -> None:
    run = cluster.run_id()
    others = cluster.nodes(2, run, 3, 3, local_addr="10.0.0.1")
    host = cluster.node(run, 3, 3, local_addr="10.0.0.9", is_host=True)
    infos = dict(zip(map(id, [*others, host]), rendezvous_all([*others, host]), strict=True))
    assert infos[id(host)].group_rank == 2


def test_stable_rank0_keeps_the_previous_rank0_without_a_host(cluster: Cluster) -> None:
    run = cluster.run_id()
    b = cluster.node(run, 2, 3, local_addr="10.0.0.2", stable_rank0=True, last_call_timeout=0.3)
    c = cluster.node(run, 2, 3, local_addr="10.0.0.3", stable_rank0=True, last_call_timeout=0.3)
    assert rendezvous_all([b, c])[0].group_rank == 0
    a = Pending(cluster.node(run, 2, 3, local_addr="10.0.0.1", stable_rank0=True, last_call_timeout=0.3))
    assert wait_for(lambda: b.num_nodes_waiting() == 1, PROMPT)
    info_b, _ = rendezvous_all([b, c])
    assert a.result().group_world_size == 3
    assert info_b.group_rank == 0, "the previous rank 0 must stay rank 0 with stable_rank0"


# -- construction ---------------------------------------------------------------------------------


def test_handler_over_store_reads_the_parameters(cluster: Cluster) -> None:
    params = RendezvousParameters(
        backend="kv",
        endpoint="",
        run_id="r",
        min_nodes=1,
        max_nodes=2,
        config={"join_timeout": "7", "plugin_key": "x"},
    )
    handler = handler_over_store(cluster.service.connect(), params)
    assert handler.config.join_timeout == 7.0
    assert handler.get_backend() == "kv" and handler.get_run_id() == "r"
    handler.shutdown()
    with pytest.raises(RendezvousConfigError, match="plugin_key"):
        handler_over_store(cluster.service.connect(), params, known_keys={"join_timeout"})


def test_invalid_sizes_and_run_id_are_refused(cluster: Cluster) -> None:
    from launcher.rendezvous.api import RendezvousError

    with pytest.raises(RendezvousError, match="1 <= MIN <= MAX"):
        DynamicRendezvousHandler(cluster.service.connect(), run_id="r", min_nodes=3, max_nodes=2)
    with pytest.raises(RendezvousError, match="run id"):
        DynamicRendezvousHandler(cluster.service.connect(), run_id="", min_nodes=1, max_nodes=1)
