"""The agent's exit barrier and its failure path, against launcher's store (no agents, no torch):
a node that finished is not taken for a lost one, the round cannot re-form once a node finished,
and the barrier's messages say what happened."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from launcher.agent.barrier import exit_barrier
from launcher.agent.finished import (
    FinishedNode,
    announce_finished,
    claim_reform,
    describe_ranks,
    exit_prefix,
    finished_nodes,
    no_reform_note,
    withdraw_claim,
)
from launcher.agent.membership import await_lost_nodes
from launcher.agent.reporting import NodeReporter
from launcher.rendezvous.api import RendezvousInfo
from launcher.store.api import StoreError
from launcher.store.server import StoreServer

pytestmark = pytest.mark.timeout(30)

PLAN = SimpleNamespace(run_id="job", node="host-a", local_addr="10.0.0.1", logs_specs=None, role="default",
                       rendezvous=SimpleNamespace(setting=lambda key: "60"))


@pytest.fixture
def server() -> Iterator[StoreServer]:
    with StoreServer("127.0.0.1", 0) as served:
        yield served


def _info(store: Any, rank: int = 0) -> RendezvousInfo:
    return RendezvousInfo(store=store, group_rank=rank, group_world_size=2, master_addr="127.0.0.1",
                          master_port=1, round=3, participants=["a_1_0", "b_2_0"], local_world_sizes=[2, 2])


def _reporter(rank: int = 0) -> NodeReporter:
    reporter = NodeReporter(PLAN, lambda *a, **k: None)  # type: ignore[arg-type]
    reporter.group_rank = rank
    reporter.node_addr = "10.0.0.1"
    return reporter


class Handler:
    """A rendezvous whose lost nodes and closed state the test sets."""

    def __init__(self, lost: list[str] | None = None) -> None:
        self.lost = lost or []
        self.closed = False

    def lost_nodes(self) -> list[str]:
        return list(self.lost)

    def is_closed(self) -> bool:
        return self.closed

    def set_closed(self) -> None:
        self.closed = True


def _node_b(store: Any) -> FinishedNode:
    node = FinishedNode(1, "b_2_0", "host-b (node 1, 10.0.0.2)")
    announce_finished(store, exit_prefix("job", 3), node)
    return node


def test_a_failed_node_does_not_wait_for_lost_nodes_once_another_finished(server: StoreServer) -> None:
    """Node b finished (its workers succeeded) and waits at the exit barrier: whatever the
    heartbeats say, re-forming without it is pointless, so this node reports its own failure."""
    events: list[Any] = []
    info = _info(server.store)
    assert finished_nodes(info, "job") == []
    assert await_lost_nodes(Handler(["b_2_0"]), PLAN, lambda *a, **k: events.append(a), info)  # type: ignore[arg-type]
    node = _node_b(server.store)
    assert finished_nodes(info, "job") == [node]
    events.clear()
    assert not await_lost_nodes(Handler(["b_2_0"]), PLAN, lambda *a, **k: events.append(a), info)  # type: ignore[arg-type]
    assert events == []


def test_a_claim_to_restart_sees_the_nodes_that_finished_and_they_see_the_claim(server: StoreServer) -> None:
    """The failing node claims before it reads; the finishing node announces before it looks:
    whichever comes second sees the first (here the finished node sees the claim and ends the job)."""
    from launcher.agent.outcome import NodeOutcome, outcome_prefix, publish_outcome

    info = _info(server.store)
    # The failing node shares its record, then claims (launcher.agent.membership.reform_blocked).
    publish_outcome(server.store, outcome_prefix("job", 3), NodeOutcome(0, "host-a", "10.0.0.1", None, "it failed"))
    assert claim_reform(info, "job") == []  # nobody had finished: the restart may go ahead
    handler = Handler()
    withdrawn: list[float] = []

    def restarting_node_sees_the_close() -> None:
        while not handler.closed:
            time.sleep(0.05)
        time.sleep(0.5)  # its rendezvous polls
        withdrawn.append(time.monotonic())
        withdraw_claim(info, "job")

    thread = threading.Thread(target=restarting_node_sees_the_close)
    thread.start()
    started = time.monotonic()
    result = exit_barrier(_info(server.store, 1), handler, _reporter(1), run_id="job", timeout=20)  # type: ignore[arg-type]
    returned = time.monotonic()
    thread.join()
    assert result is not None and result.exit_code == 1
    assert returned - started < 10
    # The finished node kept the store until the restarting node had read what it needed.
    assert withdrawn and returned >= withdrawn[0]
    assert handler.closed, "the finished node ends the job for the node that is restarting"
    assert "restarting or re-forming the group was not possible" in result.message, result.message
    # A claim made after the node finished sees it.
    assert [n.group_rank for n in claim_reform(info, "job")] == [1]


def test_a_node_lost_before_it_finished_ends_the_wait(server: StoreServer) -> None:
    """Node b is lost without having finished: node a's wait ends within about a second, with
    exit status 1 and b's ranks named, not 0 after the barrier's timeout."""
    started = time.monotonic()
    result = exit_barrier(_info(server.store), Handler(["b_2_0"]), _reporter(), run_id="job",  # type: ignore[arg-type]
                          timeout=20)
    assert result is not None and result.exit_code == 1
    assert time.monotonic() - started < 10
    assert "node 1 (b_2_0) was lost before it finished (no heartbeat): ranks 2-3 did not finish" in result.message


def test_a_node_that_finished_and_then_vanished_is_no_loss(server: StoreServer) -> None:
    """Node b finished, then was lost: node a, finishing after it, succeeds at once."""
    _node_b(server.store)
    started = time.monotonic()
    result = exit_barrier(_info(server.store), Handler(["b_2_0"]), _reporter(), run_id="job",  # type: ignore[arg-type]
                          timeout=20)
    assert result is None
    assert time.monotonic() - started < 10, "b will never say it left: it is lost, so not waited for"


def test_the_job_closed_elsewhere_fails_the_finished_node_with_the_other_nodes_cause(server: StoreServer) -> None:
    """Node b's workers failed and it closed the job after writing its record: node a, at its
    barrier, exits 1 with b's reason and notes (it exited 0 before)."""
    from launcher.agent.outcome import NodeOutcome, outcome_prefix, publish_outcome

    handler = Handler()
    record = NodeOutcome(1, "host-b", "10.0.0.2", None, "its agent received SIGTERM", ["a note for every node"])

    def close_later() -> None:
        time.sleep(0.5)
        publish_outcome(server.store, outcome_prefix("job", 3), record)
        handler.closed = True

    thread = threading.Thread(target=close_later)
    thread.start()
    result = exit_barrier(_info(server.store), handler, _reporter(), run_id="job", timeout=20)  # type: ignore[arg-type]
    thread.join()
    assert result is not None and result.exit_code == 1
    assert "the job was ended by host-b (node 1, 10.0.0.2): its agent received SIGTERM" in result.message
    assert "a note for every node" in result.message


class SilentHandler(Handler):
    """A rendezvous that says why its lost nodes are gone (as the core's does)."""

    def __init__(self, lost: list[str], why: str) -> None:
        super().__init__(lost)
        self.why = why

    def departures(self) -> dict[str, str]:
        return {node: self.why for node in self.lost}


def test_a_node_lost_by_heartbeat_silence_that_comes_back_and_finishes_fails_nobody(
        server: StoreServer, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 45: node b's agent was paused (SIGSTOP) while its workers trained on and finished:
    its heartbeats stopped, so it is reported lost with a heartbeat timeout. Node a waits for it
    rather than fail a job whose workers all succeeded; once b runs again and says it finished,
    a succeeds."""
    caplog.set_level(logging.WARNING, logger="launcher.agent")

    def b_continues() -> None:
        time.sleep(2.5)  # over two of the barrier's once-a-second looks: it saw b lost and waited
        _node_b(server.store)
        server.store.set(f"{exit_prefix('job', 3)}/done", b"1")  # b arrived last (launcher.agent.barrier)

    thread = threading.Thread(target=b_continues)
    thread.start()
    started = time.monotonic()
    result = exit_barrier(_info(server.store), SilentHandler(["b_2_0"], "heartbeat timeout"), _reporter(),  # type: ignore[arg-type]
                          run_id="job", timeout=20)
    thread.join()
    assert result is None, result.message if result else ""
    assert 2.0 < time.monotonic() - started < 15
    assert "node 1 (b_2_0) sent no heartbeat within the heartbeat timeout and has not finished: waiting" in caplog.text
    assert caplog.text.count("sent no heartbeat") == 1, "said once, not at every look"


def test_a_node_lost_by_heartbeat_silence_that_never_comes_back_fails_the_job_at_the_timeout(
        server: StoreServer) -> None:
    """Its ranks are not known to have finished: at --exit-barrier-timeout the job fails, naming
    it (never the success a slow but live node gets at the timeout)."""
    started = time.monotonic()
    result = exit_barrier(_info(server.store), SilentHandler(["b_2_0"], "heartbeat timeout"), _reporter(),  # type: ignore[arg-type]
                          run_id="job", timeout=2)
    assert result is not None and result.exit_code == 1
    assert time.monotonic() - started >= 2
    assert ("node 1 (b_2_0) was lost before it finished (no heartbeat, and it did not come back within "
            "--exit-barrier-timeout): ranks 2-3 did not finish") in result.message, result.message


def test_a_node_whose_agent_died_is_not_waited_for(server: StoreServer) -> None:
    """A closed connection is a certain death (its workers die with its agent): no wait."""
    started = time.monotonic()
    result = exit_barrier(_info(server.store), SilentHandler(["b_2_0"], "agent process died"), _reporter(),  # type: ignore[arg-type]
                          run_id="job", timeout=20)
    assert result is not None and result.exit_code == 1
    assert time.monotonic() - started < 10
    assert "node 1 (b_2_0) was lost before it finished (agent process died): ranks 2-3 did not finish" \
        in result.message, result.message


class FailingStore:
    """A store whose host went away."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("connection to the store at 10.0.0.1:29400 failed: the store closed the connection")

        return fail


def test_a_store_gone_before_every_node_finished_fails_naming_the_missing_nodes() -> None:
    result = exit_barrier(_info(FailingStore()), Handler(), _reporter(), run_id="job",  # type: ignore[arg-type]
                          timeout=300)
    assert result is not None and result.exit_code == 1
    assert "the store closed the connection" in result.message, result.message
    assert "lost with the store: node 1 (b_2_0) with ranks 2-3" in result.message, result.message
    assert "300" not in result.message, result.message


def test_the_barrier_timeout_is_named(server: StoreServer, caplog: pytest.LogCaptureFixture) -> None:
    """Every node alive but one slow: the wait ends at the timeout, and this node's success stands."""
    caplog.set_level(logging.WARNING, logger="launcher.agent")
    result = exit_barrier(_info(server.store), Handler(), _reporter(), run_id="job",  # type: ignore[arg-type]
                          timeout=0.5)
    assert result is None
    assert "not every node finished within 0.5 s (--exit-barrier-timeout)" in caplog.text, caplog.text


def test_the_notes_name_every_finished_node_and_ranks_read_well() -> None:
    nodes = [FinishedNode(2, "c", "host-c (node 2, 10.0.0.3)"), FinishedNode(0, "a", "host-a (node 0, 10.0.0.1)")]
    assert no_reform_note(nodes).startswith(
        "a restart was not possible: host-a (node 0, 10.0.0.1), host-c (node 2, 10.0.0.3) had all finished")
    assert describe_ranks(range(4, 6)) == "ranks 4-5"
    assert describe_ranks([3]) == "rank 3"
    assert describe_ranks([1, 3]) == "ranks 1, 3"
    assert describe_ranks(None) == "its ranks"
