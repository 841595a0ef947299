"""The core's rendezvous over etcd: simulated nodes (threads, one killed process), real etcd."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from etcd_helpers import make_store, node_params
from etcd_servers import PYTHON, EtcdCluster, python_env
from launcher.rendezvous.api import RendezvousClosedError, RendezvousInfo
from launcher_etcd.backend import create_handler

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def handlers() -> Iterator[Callable[..., Any]]:
    """``handlers(params)`` builds a handler; every one is shut down after the test."""
    made: list[Any] = []

    def make(params: Any) -> Any:
        made.append(create_handler(params))
        return made[-1]

    yield make
    for handler in made:
        handler.shutdown()


def rendezvous_all(nodes: list[Any], timeout: float = 60.0) -> list[RendezvousInfo]:
    """``next_rendezvous`` on every node at once; their infos in order (errors re-raised)."""
    results: list[Any] = [None] * len(nodes)

    def run(i: int) -> None:
        try:
            results[i] = nodes[i].next_rendezvous()
        except BaseException as exc:  # re-raised below, in the test's thread
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(nodes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "next_rendezvous did not return"
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_full_round_assigns_ranks_and_shares_a_store(
    shared_etcd: EtcdCluster, run_id: str, handlers: Callable[..., Any]
) -> None:
    nodes = [handlers(node_params(shared_etcd.endpoint, run_id, "4")) for _ in range(4)]
    infos = rendezvous_all(nodes)
    assert sorted(i.group_rank for i in infos) == [0, 1, 2, 3]
    assert {i.group_world_size for i in infos} == {4} and len({i.round for i in infos}) == 1
    assert all(i.participants == infos[0].participants for i in infos)
    assert [node.node.id for node in nodes] == [infos[0].participants[i.group_rank] for i in infos]
    # etcd cannot serve the workers: group rank 0's agent serves their store and names it.
    assert {(i.master_addr, i.master_port, i.use_agent_store) for i in infos} == {
        ("127.0.0.1", infos[0].master_port, True)
    }
    # That store admits only the round's participants (docs/etcd.md, "Who may use the stores").
    rank0 = next(node for node, info in zip(nodes, infos, strict=True) if info.group_rank == 0)
    assert {str(ip) for ip in rank0._workers._server.members} == {"127.0.0.1"}
    # The round's store is shared by the agents (rank assignment, exit barrier).
    stores = [i.store for i in infos]
    assert all(store is not None for store in stores)
    stores[0].set("greeting", b"hi")  # type: ignore[union-attr]
    assert stores[3].get("greeting") == b"hi"  # type: ignore[union-attr]
    assert sorted(store.add("arrived", 1) for store in stores) == [1, 2, 3, 4]  # type: ignore[union-attr]
    assert all(node.num_nodes_waiting() == 0 and node.lost_nodes() == [] for node in nodes)
    assert nodes[0].get_run_id() == run_id and nodes[0].get_backend() == "etcd"


def test_min_max_last_call_then_a_late_node_is_admitted_on_the_next_round(
    shared_etcd: EtcdCluster, run_id: str, handlers: Callable[..., Any]
) -> None:
    params = node_params(shared_etcd.endpoint, run_id, "2:4", last_call_timeout="1")
    first = [handlers(params) for _ in range(3)]
    start = time.monotonic()
    infos = rendezvous_all(first)
    assert {i.group_world_size for i in infos} == {3}  # MIN reached, the last call ended at 3
    assert 0.8 < time.monotonic() - start < 10
    late = handlers(params)
    late_result: list[Any] = []
    thread = threading.Thread(target=lambda: late_result.append(late.next_rendezvous()), daemon=True)
    thread.start()
    # The running nodes see one node waiting: their agents would restart them into a new round.
    wait_for(lambda: all(node.num_nodes_waiting() >= 1 for node in first), 20, "the waiting node to be seen")
    again = rendezvous_all(first)
    thread.join(30)
    assert late_result, "the late node was not admitted"
    everyone = [*again, late_result[0]]
    assert sorted(i.group_rank for i in everyone) == [0, 1, 2, 3]
    assert {i.group_world_size for i in everyone} == {4} and {i.round for i in everyone} == {infos[0].round + 1}


def test_a_killed_node_loses_its_keys_and_is_reported_lost_then_survivors_reform(
    shared_etcd: EtcdCluster, run_id: str, handlers: Callable[..., Any]
) -> None:
    conf = {"lease_ttl": "2", "keep_alive_interval": "0.5", "heartbeat_timeout": "2", "last_call_timeout": "1"}
    child = subprocess.Popen(
        [PYTHON, "etcd_node.py", shared_etcd.endpoint, run_id, "2:3", *(f"{k}={v}" for k, v in conf.items())],
        cwd=str(__import__("pathlib").Path(__file__).parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(),
    )
    try:
        # A client of its own under the job's prefix, to look at the victim's keys.
        probe = make_store(shared_etcd.endpoint, f"/launcher/{run_id}/")
        # The child joins first (its participant record is written), however slowly its interpreter
        # starts: else the two below could form the round without it after their last call.
        wait_for(lambda: probe.check([f"launcher/rdzv/{run_id}/0/node/1"]), 60, "the child to join")
        survivors = [handlers(node_params(shared_etcd.endpoint, run_id, "2:3", **conf)) for _ in range(2)]
        infos = rendezvous_all(survivors)
        line = child.stdout.readline() if child.stdout else ""
        assert line, child.stderr.read() if child.stderr else "no output"
        victim = json.loads(line)
        assert infos[0].group_world_size == 3 and victim["id"] in infos[0].participants
        victim_keys = [f"launcher/rdzv/{run_id}/{victim['round']}/hb/{victim['rank']}"]
        # The first heartbeat is written by the node's heartbeat thread, a tick after the round.
        wait_for(lambda: probe.check(victim_keys), 5, "the victim's first heartbeat")
        child.kill()  # SIGKILL: no goodbye, no lease revocation
        child.wait(10)
        killed_at = time.monotonic()
        lost = wait_for(lambda: all(victim["id"] in n.lost_nodes() for n in survivors), 15, "the lost node")
        assert lost
        wait_for(lambda: not probe.check(victim_keys), 10, "the victim's keys to expire")
        assert time.monotonic() - killed_at < 12
        # The survivors' agents would now restart: the next round forms without the dead node.
        again = rendezvous_all(survivors)
        assert {i.group_world_size for i in again} == {2}
        assert victim["id"] not in again[0].participants
        probe.close()
    finally:
        child.kill()
        child.wait(10)


def test_etcd_restarted_mid_rendezvous(
    etcd_cluster: Callable[..., EtcdCluster], run_id: str, handlers: Callable[..., Any]
) -> None:
    cluster = etcd_cluster(1)
    member = cluster.members[0]
    params = node_params(cluster.endpoint, run_id, "3", read_timeout="20")
    nodes = [handlers(params) for _ in range(3)]
    results: list[Any] = [None, None]

    def run(i: int) -> None:
        try:
            results[i] = nodes[i].next_rendezvous()
        except BaseException as exc:
            results[i] = exc

    early = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for thread in early:
        thread.start()
    time.sleep(1.0)  # two nodes joined and wait (watching) for the third
    member.stop()  # SIGTERM, data kept
    time.sleep(1.5)
    member.start()
    member.wait_ready()
    third = nodes[2].next_rendezvous()
    for thread in early:
        thread.join(30)
    assert not any(isinstance(r, BaseException) for r in results), results
    infos = [*results, third]
    assert sorted(i.group_rank for i in infos) == [0, 1, 2] and {i.group_world_size for i in infos} == {3}


def test_set_closed_ends_the_job_for_late_nodes(
    shared_etcd: EtcdCluster, run_id: str, handlers: Callable[..., Any]
) -> None:
    nodes = [handlers(node_params(shared_etcd.endpoint, run_id, "2")) for _ in range(2)]
    rendezvous_all(nodes)
    nodes[0].set_closed()
    assert nodes[1].is_closed()
    late = handlers(node_params(shared_etcd.endpoint, run_id, "2"))
    with pytest.raises(RendezvousClosedError):
        late.next_rendezvous()


def test_a_finished_jobs_id_can_be_used_again_once_its_nodes_keys_expired(
    shared_etcd: EtcdCluster, run_id: str, handlers: Callable[..., Any]
) -> None:
    params = node_params(shared_etcd.endpoint, run_id, "2", lease_ttl="2")
    first = [handlers(params) for _ in range(2)]
    rendezvous_all(first)
    first[0].set_closed()
    for node in first:
        node.shutdown()  # a clean exit: the keys stay until the lease runs out
    # Its nodes' keys are still there: a node now is a late node of the ended job.
    with pytest.raises(RendezvousClosedError):
        handlers(params).next_rendezvous()
    time.sleep(3.0)  # past lease_ttl: nothing of the old job is alive
    second = [handlers(params) for _ in range(2)]
    infos = rendezvous_all(second)
    assert sorted(i.group_rank for i in infos) == [0, 1] and infos[0].round == 0


def test_the_id_of_a_job_whose_nodes_all_died_can_be_used_again(
    shared_etcd: EtcdCluster, run_id: str, handlers: Callable[..., Any]
) -> None:
    params = node_params(shared_etcd.endpoint, run_id, "2", lease_ttl="2")
    first = [handlers(params) for _ in range(2)]
    rendezvous_all(first)
    running = [handlers(params) for _ in range(2)]  # a live job is never cleared
    probe = make_store(shared_etcd.endpoint, f"/launcher/{run_id}/")
    assert probe.check([f"launcher/rdzv/{run_id}/current", f"launcher/rdzv/{run_id}/0/sealed"])
    probe.close()
    for node in [*first, *running]:
        node.shutdown()  # no set_closed: as if every node had died
    time.sleep(3.0)  # past lease_ttl
    second = [handlers(params) for _ in range(2)]
    infos = rendezvous_all(second)
    assert sorted(i.group_rank for i in infos) == [0, 1] and infos[0].round == 0
