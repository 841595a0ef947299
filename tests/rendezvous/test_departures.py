"""Departures and spares: the one record of gone nodes, the c10d store seeing a dead agent's
connection close, the watchdog's death notice, and nodes beyond MAX waiting as spares."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from launcher.containment._watchdog_main import __file__ as WATCHDOG_SCRIPT
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.departures import (
    AGENT_DIED,
    HEARTBEAT_TIMEOUT,
    Departure,
    decode_report,
    describe,
    encode_report,
)
from launcher.rendezvous.dynamic import DynamicRendezvousHandler
from launcher.store.client import TCPStoreClient
from launcher.store.server import StoreServer

from .conftest import PROMPT, Cluster, Pending, rendezvous_all, wait_for

pytestmark = pytest.mark.timeout(60)


def test_a_report_keeps_the_node_and_why_and_reads_a_bare_id() -> None:
    assert decode_report(encode_report("10.0.0.1_7_0", AGENT_DIED)) == Departure("10.0.0.1_7_0", AGENT_DIED)
    assert decode_report(b"10.0.0.1_7_0") == Departure("10.0.0.1_7_0")
    assert describe(["b", "a"], {"a": HEARTBEAT_TIMEOUT}) == "b, a (heartbeat timeout)"


# -- the store: keys tied to the connection that last wrote them ----------------------------------------


def test_the_server_reports_the_keys_a_closed_connection_wrote_last() -> None:
    closed: list[list[str]] = []
    with StoreServer() as server:
        server.on_writer_closed(lambda key: key.startswith("hb/"), lambda keys, _unreachable: closed.append(keys))
        a = TCPStoreClient(server.host, server.port, timeout=10)
        b = TCPStoreClient(server.host, server.port, timeout=10)
        a.add("hb/0", 1)
        a.add("hb/shared", 1)
        a.set("other", b"x")  # not matched: never reported
        b.add("hb/shared", 1)  # b wrote it last
        b.add("hb/0", 0)  # a read: a stays its writer
        a.close()
        assert wait_for(lambda: closed == [["hb/0"]], 5), closed
        b.close()
        assert wait_for(lambda: closed == [["hb/0"], ["hb/shared"]], 5), closed
        c = TCPStoreClient(server.host, server.port, timeout=10)
        c.add("hb/1", 1)
    # The server closing its own connections is no client's death.
    time.sleep(0.2)
    assert closed == [["hb/0"], ["hb/shared"]]
    c.close()


# -- c10d: a dead agent is reported when its connection closes ---------------------------------------

_NODE = textwrap.dedent(
    """
    import sys, time
    from launcher.rendezvous.config import DynamicRendezvousConfig
    from launcher.rendezvous.dynamic import DynamicRendezvousHandler
    from launcher.store.client import TCPStoreClient

    port, run, leave = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "leave"
    config = DynamicRendezvousConfig(keep_alive_interval=5, heartbeat_timeout=60, last_call_timeout=0.5)
    handler = DynamicRendezvousHandler(TCPStoreClient("127.0.0.1", port, timeout=30), run_id=run,
                                       min_nodes=2, max_nodes=2, config=config)
    info = handler.next_rendezvous()
    print(info.group_rank, flush=True)
    if leave:
        sys.stdin.readline()
        handler.shutdown()
    else:
        time.sleep(600)
    """
)


def _host_and_node(tmp_path: Path, run: str, mode: str) -> tuple[StoreServer, DynamicRendezvousHandler,
                                                                   subprocess.Popen[str], int]:
    server = StoreServer("127.0.0.1", 0).start()
    config = DynamicRendezvousConfig(keep_alive_interval=5, heartbeat_timeout=60, last_call_timeout=0.5)
    host = DynamicRendezvousHandler(TCPStoreClient("127.0.0.1", server.port, timeout=30), run_id=run,
                                    min_nodes=2, max_nodes=2, config=config, is_host=True, store_server=server,
                                    on_shutdown=server.close)
    script = tmp_path / "node.py"
    script.write_text(_NODE)
    child = subprocess.Popen([sys.executable, str(script), str(server.port), run, mode], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    pending = Pending(host)
    pending.result()
    assert child.stdout is not None
    rank = int(child.stdout.readline())
    # Its first heartbeat (one watcher tick after the round formed) ties its counter to its connection.
    # The key alone is no sign of it: the host's watcher reads the counter with add(key, 0), which
    # creates the key (but, a read, ties it to nobody) and can come first.
    hb = host._keys.heartbeat(0, rank)
    assert wait_for(lambda: server.store.add(hb, 0) >= 1, PROMPT), "the node never beat"
    return server, host, child, rank


def test_a_killed_agent_is_reported_at_once_not_after_the_heartbeat_timeout(tmp_path: Path) -> None:
    server, host, child, _ = _host_and_node(tmp_path, "dead-node", "stay")
    try:
        child.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        # Half the heartbeat timeout: reported before it, whatever the machine's load (on a loaded
        # CI machine the watcher's 5 s ticks can run late).
        assert wait_for(lambda: bool(host.lost_nodes()), 30), "the dead node was not reported within 30 s"
        took = time.monotonic() - killed
        (lost,) = host.lost_nodes()
        assert host.departures() == {lost: AGENT_DIED}
        assert took < 30, f"{took:.1f} s: the heartbeat timeout is 60 s, the connection closed at once"
    finally:
        child.kill()
        child.wait()
        host.shutdown()


def test_an_agent_that_leaves_cleanly_is_not_reported(tmp_path: Path) -> None:
    server, host, child, _ = _host_and_node(tmp_path, "clean-node", "leave")
    try:
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(PROMPT) == 0
        time.sleep(1.0)  # a verdict would be out by now
        assert host.lost_nodes() == []
    finally:
        host.shutdown()


# -- the watchdog's death notice ---------------------------------------------------------------------------


def _watchdog(lines: str) -> None:
    proc = subprocess.Popen([sys.executable, "-I", "-S", WATCHDOG_SCRIPT, ""], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(lines.encode())
    proc.stdin.close()  # the agent's end: closed without "exit" is its death
    assert proc.wait(PROMPT) == 0


def test_the_watchdog_runs_the_death_notice_when_the_agent_dies(tmp_path: Path) -> None:
    mark = tmp_path / "noticed"
    argv = [sys.executable, "-c", f"open({str(mark)!r}, 'w').write('x')"]
    _watchdog("!" + "\0".join(argv) + "\n")
    assert mark.read_text() == "x"


def test_the_watchdog_runs_no_notice_on_a_clean_exit_or_once_cleared(tmp_path: Path) -> None:
    mark = tmp_path / "noticed"
    argv = [sys.executable, "-c", f"open({str(mark)!r}, 'w').write('x')"]
    _watchdog("!" + "\0".join(argv) + "\nexit\n")
    _watchdog("!" + "\0".join(argv) + "\n!\n")
    assert not mark.exists()


# -- spares ----------------------------------------------------------------------------------------------


def test_a_spare_says_so_outlives_the_join_timeout_and_takes_a_lost_nodes_place(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="launcher.rendezvous")
    run = cluster.run_id()
    members = cluster.nodes(2, run, 2, 2, join_timeout=1.5)
    rendezvous_all(members)
    spare_handler = cluster.node(run, 2, 2, join_timeout=1.5)
    spare = Pending(spare_handler)
    assert wait_for(lambda: "waiting as a spare: the job has its 2 nodes" in caplog.text, PROMPT), caplog.text
    assert members[0].num_nodes_waiting() == 0, "a spare must not make a full round re-form"
    time.sleep(2.5)  # past its join timeout: a spare waits for as long as the job runs
    assert not spare.done(), spare.error
    cluster.sever(members[1])
    assert wait_for(lambda: bool(members[0].lost_nodes()), PROMPT)
    assert members[0].departures() == {members[1].node.id: HEARTBEAT_TIMEOUT}
    survivor = Pending(members[0])
    infos = [survivor.result(), spare.result()]
    assert {i.round for i in infos} == {1}
    assert sorted(infos[0].participants) == sorted([members[0].node.id, spare_handler.node.id])
    assert "this spare is called" in caplog.text
    # Called in, the spare knows whose place it took and why (it was in no round that saw it go).
    assert spare_handler.departures() == {members[1].node.id: HEARTBEAT_TIMEOUT}



# -- put out on purpose: a straggler (launcher.stragglers.exclusion) -------------------------------------


def _finding(node: str, rank: int):
    from launcher.stragglers.verdict import Finding

    return Finding(rank, node, 0, 1.31, "collectives", 0.9, 0.7, 0.1, 0.3, 0.0, 0.0, True, 4.0)


def test_a_straggler_is_put_out_once_by_one_node_and_the_others_name_it(cluster: Cluster) -> None:
    from launcher.stragglers.exclusion import EXIT_NODE_EXCLUDED, Exclusion, NodeExcluded

    run = cluster.run_id()
    nodes = cluster.nodes(3, run, 2, 3, last_call_timeout=0.3)
    infos = rendezvous_all(nodes)
    by_rank = {info.group_rank: (handler, info) for handler, info in zip(nodes, infos, strict=True)}
    slow, slow_info = by_rank[2]
    said: dict[int, list[str]] = {rank: [] for rank in by_rank}
    events: dict[int, list[dict]] = {rank: [] for rank in by_rank}
    exclusions = {rank: Exclusion(lambda kind, rank=rank, **data: events[rank].append({"type": kind, **data}),
                                  said[rank].extend) for rank in by_rank}
    finding = _finding(slow.node.id, 2)
    for rank, (handler, info) in by_rank.items():
        exclusions[rank].propose([_finding(slow.node.id, 2)._replace(ratio=1.2, rank=5), finding], info)
        exclusions[rank].act(handler, info)
        exclusions[rank].act(handler, info)  # once per verdict
    assert all(not lines for lines in said.values()), said
    # Rank 0 decided alone: one report, with the reason, seen by every node of the round.
    assert nodes[0].lost_nodes() == [slow.node.id]
    assert nodes[0]._ops.add(nodes[0]._keys.lost_count(slow_info.round), 0) == 1
    for rank, (handler, _) in by_rank.items():
        assert handler.lost_nodes() == [slow.node.id]
        assert handler.departures()[slow.node.id].startswith("straggler: rank 2 (local rank 0) 1.31x slower")
        if rank == 2:
            with pytest.raises(NodeExcluded) as raised:
                exclusions[rank].before_join(handler)
            assert raised.value.exit_code == EXIT_NODE_EXCLUDED == 69
            assert "was put out of the job as a straggler (rank 2" in str(raised.value)
        else:
            exclusions[rank].before_join(handler)
            exclusions[rank].before_join(handler)  # named once
            assert len(said[rank]) == 1 and said[rank][0].startswith(
                f"launcher: straggler excluded: node {slow.node.id} was put out of the job (rank 2 "), said
        assert [(e["type"], e["excluded_node"], e["check"]) for e in events[rank]] == [
            ("node_excluded", slow.node.id, "straggler")]
    survivors = [by_rank[0][0], by_rank[1][0]]
    assert sorted(i.group_world_size for i in rendezvous_all(survivors)) == [2, 2]


def test_never_below_min_unless_a_spare_waits_and_never_the_stores_host(cluster: Cluster) -> None:
    from launcher.stragglers.exclusion import Exclusion

    run = cluster.run_id()
    host = cluster.node(run, 2, 2, join_timeout=5, is_host=True)
    other = cluster.node(run, 2, 2, join_timeout=5)
    infos = dict(zip((host, other), rendezvous_all([host, other]), strict=True))
    below = "the job would fall below its 2 nodes minimum and no spare waits"
    assert other.put_out(other.node.id, "straggler: x") == below
    assert host.put_out(host.node.id, "straggler: x", publish=False).startswith("it serves the rendezvous store")
    said: list[str] = []
    exclusion = Exclusion(None, said.extend)
    exclusion.propose([_finding(other.node.id, 1)], infos[host])
    exclusion.act(host, infos[host])
    assert said == [f"launcher: straggler not excluded: node {other.node.id} (rank 1, 1.31x slower than the median "
                    f"rank) stays in the job: {below}"]
    assert host.lost_nodes() == []
    spare_handler = cluster.node(run, 2, 2, join_timeout=5)
    spare = Pending(spare_handler)
    assert wait_for(lambda: host.put_out(other.node.id, "straggler: x", publish=False) is None, PROMPT)
    assert host.put_out(other.node.id, "straggler: rank 1") is None
    assert host.lost_nodes() == [other.node.id]
    assert sorted(i.group_world_size for i in [Pending(host).result(), spare.result()]) == [2, 2]
    # The spare names the straggler whose place it took once it has joined, once.
    spare_said: list[str] = []
    spare_exclusion = Exclusion(None, spare_said.extend)
    spare_exclusion.after_join(spare_handler)
    spare_exclusion.after_join(spare_handler)
    assert spare_said == [f"launcher: straggler excluded: node {other.node.id} was put out of the job (rank 1); "
                          f"the job goes on without it"]
    assert spare_exclusion.excluded == {other.node.id: "straggler: rank 1"}
