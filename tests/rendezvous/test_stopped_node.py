"""A node that is stopped (a signal) tells the others through the rendezvous, and a stopped host
serves the others' departure for seconds, not close_timeout (docs/failures.md, "Stopping")."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from launcher.rendezvous.api import RendezvousClosedError, RendezvousError
from launcher.rendezvous.c10d import open_store
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.liveness import STOPPED_GRACE

from .conftest import PROMPT, Cluster, Pending, rendezvous_all, wait_for

REASON = "stopped by SIGTERM"


def test_a_stopped_node_the_job_can_do_without_departs_and_the_others_re_form(cluster: Cluster) -> None:
    run = cluster.run_id()
    nodes = cluster.nodes(3, run, 2, 3, last_call_timeout=0.3)
    infos = rendezvous_all(nodes)
    victim = next(h for h, i in zip(nodes, infos, strict=True) if i.group_rank == 2)
    others = [h for h in nodes if h is not victim]
    assert victim.depart(REASON) is True  # 3 nodes, MIN 2: the job goes on
    for handler in others:
        assert handler.lost_nodes() == [victim.node.id]
        assert handler.departures()[victim.node.id] == REASON
        assert not handler.is_closed()
    assert sorted(i.group_world_size for i in rendezvous_all(others)) == [2, 2]


def test_a_stopped_node_the_job_cannot_do_without_closes_the_job_naming_itself(cluster: Cluster) -> None:
    run = cluster.run_id()
    host = cluster.node(run, 2, 2, is_host=True)
    other = cluster.node(run, 2, 2)
    rendezvous_all([host, other])
    assert other.depart(REASON) is False  # at MIN, no spare: the job ends for every node
    assert host.is_closed()
    with pytest.raises(RendezvousClosedError, match=f"{other.node.id}: {REASON}"):
        host.next_rendezvous()


def test_a_stopped_node_already_reported_by_its_closed_connection_still_closes_the_job(cluster: Cluster) -> None:
    """The signal that stops a node can cut one of its store calls short; the client then drops
    that connection, and the store reports the node gone (``agent process died``) before its
    agent departs. That report must not stand for the departure: at MIN the job still ends for
    every node, naming the signal (CI: the other node ran on, taking the stopped node, which had
    finished, for one whose work was done)."""
    from launcher.rendezvous.departures import report_departure

    run = cluster.run_id()
    host = cluster.node(run, 2, 2, is_host=True)
    other = cluster.node(run, 2, 2)
    infos = rendezvous_all([host, other])
    # What the store server writes when a member's connection closes without leaving.
    report_departure(host._ops, host._keys, infos[0].round, other.node.id, "agent process died")
    assert host.lost_nodes() == [other.node.id]
    assert other.depart(REASON) is False
    assert host.is_closed()
    with pytest.raises(RendezvousClosedError, match=f"{other.node.id}: {REASON}"):
        host.next_rendezvous()


def test_the_stores_host_never_departs_it_closes_the_job(cluster: Cluster) -> None:
    run = cluster.run_id()
    nodes = cluster.nodes(2, run, 1, 3, last_call_timeout=0.3)
    host = cluster.node(run, 1, 3, is_host=True)
    rendezvous_all([*nodes, host])
    assert host.depart(REASON) is False  # the others cannot do without its store
    assert all(n.is_closed() for n in nodes)


def test_a_node_in_no_round_closes_the_job_for_the_nodes_waiting_to_join(cluster: Cluster) -> None:
    run = cluster.run_id()
    waiting = Pending(cluster.node(run, 3, 3))
    victim = cluster.node(run, 3, 3)  # its wait to join was ended by the signal (the agent's part)
    assert wait_for(lambda: victim._ops.add(victim._keys.seq(0), 0) >= 1, PROMPT)
    assert victim.depart(REASON) is False
    with pytest.raises(RendezvousClosedError, match=f"{victim.node.id}: {REASON}"):
        waiting.result()


def test_a_stopped_host_serves_the_others_departure_for_seconds_not_close_timeout(cluster: Cluster, caplog) -> None:
    run = cluster.run_id()
    host = cluster.node(run, 2, 2, is_host=True, close_timeout=120.0)
    other = cluster.node(run, 2, 2)
    rendezvous_all([host, other])  # the other never leaves: it is stuck, say
    # The agent's signal came while the host served the store (after the job succeeded here).
    host.stop_requested = lambda: True
    done = threading.Event()
    with caplog.at_level(logging.INFO, logger="launcher.rendezvous"):
        threading.Thread(target=lambda: (host.shutdown(), done.set()), daemon=True).start()
        assert done.wait(60), "the stopped host waited for close_timeout"
    assert (f"1 node(s) had not left after {STOPPED_GRACE:g} s (this node is stopped): {other.node.id}; "
            "stopping the store") in caplog.text


def test_a_port_this_machine_cannot_bind_and_nobody_answers_on_is_named_at_once() -> None:
    with socket.socket() as holder:  # bound, never listening: not a store, and never one
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(RendezvousError) as raised:
            open_store("127.0.0.1", port, is_host=True, explicit=False,
                       config=DynamicRendezvousConfig(join_timeout=600.0), run_id="taken")
        assert time.monotonic() - started < 60  # not the join timeout
    assert str(raised.value) == (f"port {port} on this machine is taken by another program that accepts no "
                                 "connections; choose another --rdzv-endpoint port")
