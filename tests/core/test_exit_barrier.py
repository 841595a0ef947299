"""The agent's exit barrier and its failure path, against launcher's store (no agents, no torch):
a node that finished is not taken for a lost one, and the barrier's messages say what happened."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from launcher.agent.barrier import exit_barrier, finished_nodes
from launcher.agent.membership import await_lost_nodes
from launcher.rendezvous.api import RendezvousInfo
from launcher.store.api import StoreError
from launcher.store.server import StoreServer

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def server() -> Iterator[StoreServer]:
    with StoreServer("127.0.0.1", 0) as served:
        yield served


def _info(store: Any, rank: int = 0) -> RendezvousInfo:
    return RendezvousInfo(store=store, group_rank=rank, group_world_size=2, master_addr="127.0.0.1",
                          master_port=1, round=3, participants=["a_1_0", "b_2_0"])


class LosingHandler:
    """A rendezvous that reports node b lost, and is never closed."""

    def lost_nodes(self) -> list[str]:
        return ["b_2_0"]

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass


def test_a_failed_node_does_not_wait_for_lost_nodes_once_another_finished(server: StoreServer) -> None:
    """Node b finished (its workers succeeded) and waits at the exit barrier: whatever the
    heartbeats say, re-forming without it is pointless, so this node reports its own failure."""
    plan = SimpleNamespace(run_id="job", rendezvous=SimpleNamespace(setting=lambda key: "60"))
    events: list[Any] = []
    info = _info(server.store)
    assert finished_nodes(info, "job") == 0
    assert await_lost_nodes(LosingHandler(), plan, lambda *a, **k: events.append(a), info)  # type: ignore[arg-type]
    server.store.add("launcher/job/exit/3/count", 1)  # node b reached its barrier
    assert finished_nodes(info, "job") == 1
    events.clear()
    assert not await_lost_nodes(LosingHandler(), plan, lambda *a, **k: events.append(a), info)  # type: ignore[arg-type]
    assert events == []


class FailingStore:
    """A store whose host went away."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("connection to the store at 10.0.0.1:29400 failed: the store closed the connection")

        return fail


def test_the_barrier_says_the_store_went_away_not_that_it_waited(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="launcher.agent")
    exit_barrier(_info(FailingStore()), LosingHandler(), SimpleNamespace(), run_id="job",  # type: ignore[arg-type]
                 timeout=300)
    assert "the rendezvous store stopped answering" in caplog.text, caplog.text
    assert "300" not in caplog.text, caplog.text


def test_the_barrier_timeout_is_named(server: StoreServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="launcher.agent")
    exit_barrier(_info(server.store), LosingHandler(), SimpleNamespace(), run_id="job",  # type: ignore[arg-type]
                 timeout=0.5)
    assert "not every node finished within 0.5 s (--exit-barrier-timeout)" in caplog.text, caplog.text
