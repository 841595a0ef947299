"""A hang across namespace hosts: a rank on node B hangs, and both nodes' reports name it."""

from __future__ import annotations

import re

import pytest

from tests.multinode.harness import SCRIPTS, wait_all

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
]

HANG_WORKER = str(SCRIPTS / "hang_worker.py")
SIXTH_WORKER = str(SCRIPTS / "sixth_worker.py")
RDZV_PORT = 29400


@pytest.mark.timeout(120)
def test_a_rank_hung_on_one_node_is_named_on_both(make_network, start_agent, tmp_path):
    net = make_network(2)
    args = [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(RDZV_PORT), "--rdzv-id", "mn-hang", "--rdzv-conf", "join_timeout=60",
        "--monitor-interval", "0.2", "--hang-timeout", "3",
    ]
    env = {"HANG_RANK": "3", "TMPDIR": str(tmp_path)}
    agents = [start_agent(net[i], [*args, "--local-addr", net[i].addr, HANG_WORKER], env=env) for i in (0, 1)]
    codes = wait_all(agents, 90, expect=None)
    detail = "\n".join(a.describe(80) for a in agents)
    assert codes == [1, 1], detail
    for agent in agents:
        err = agent.stderr
        # Global rank 3 is node B's second worker (node B has group rank 1 and ranks 2-3).
        assert re.search(rf"^Hung ranks:\n  rank 3 on {re.escape(net[1].addr)}_\d+_\d+ \(local rank 1", err,
                         re.M), detail
        assert re.search(r"^  rank 3: stuck_on_purpose \(hang_worker\.py:\d+\)", err, re.M), detail
        assert re.search(r"^  ranks 0-2: main \(hang_worker\.py:\d+\)", err, re.M), detail
        assert f"hang detected by {net[1].addr}_" in err, detail


@pytest.mark.timeout(120)
def test_both_nodes_restart_after_a_hang_and_finish(make_network, start_agent, tmp_path):
    net = make_network(2)
    args = [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(RDZV_PORT), "--rdzv-id", "mn-hang-restart",
        "--rdzv-conf", "join_timeout=60", "--monitor-interval", "0.2", "--hang-timeout", "2", "--max-restarts", "1",
    ]
    env = {"HANG_RANK": "2", "HANG_ONCE": "1", "HANG_STEPS": "40", "TMPDIR": str(tmp_path)}
    agents = [start_agent(net[i], [*args, "--local-addr", net[i].addr, HANG_WORKER], env=env) for i in (0, 1)]
    wait_all(agents, 90)
    for agent in agents:
        assert re.search(r"^  rank 2: stuck_on_purpose \(hang_worker\.py:\d+\)", agent.stderr, re.M), agent.describe()
        assert "restarting them (restart 1 of 1)" in agent.stderr, agent.describe()


@pytest.mark.timeout(120)
def test_the_flight_records_of_both_nodes_blame_the_rank_that_did_not_enter(make_network, start_agent, tmp_path):
    net = make_network(2)
    args = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(RDZV_PORT), "--rdzv-id", "mn-flightrec", "--rdzv-conf", "join_timeout=60",
        "--monitor-interval", "0.2", "--hang-timeout", "2",
    ]
    env = {"LATE_RANK": "1", "TMPDIR": str(tmp_path)}
    agents = [start_agent(net[i], [*args, "--local-addr", net[i].addr, SIXTH_WORKER], env=env) for i in (0, 1)]
    codes = wait_all(agents, 90, expect=None)
    detail = "\n".join(a.describe(80) for a in agents)
    assert codes == [1, 1], detail
    for agent in agents:
        err = agent.stderr
        # Rank 1 is node B's only worker: node A's record shows rank 0 inside #6, node B's that rank 1
        # stopped at #5; the comparison is made where both summaries are joined, on each node.
        assert ("  process group 0 (default_pg), collective #6 gloo:all_reduce, sizes [[4]]: not entered by rank 1 "
                "(last entered #5); rank 0 inside it\n  blamed: rank 1") in err, detail
        assert re.search(r"hang detected by \S+: rank 1 \(local rank 0\): no heartbeat for .*; did not enter "
                         r"collective #6 ", err), detail
        root = err.split("Root cause (first failure):\n", 1)[-1]
        assert re.match(r"  time +: .*\n  node +: .*\n  rank +: 1 \(local rank 0,", root), detail
