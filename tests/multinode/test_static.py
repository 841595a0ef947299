"""The static backend across two namespace hosts (fixed size, ranks given by --node-rank)."""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.multinode.harness import ALLREDUCE, FAILING, all_reduce_ranks, wait_all

pytestmark = [pytest.mark.netns, pytest.mark.slow]

MASTER_PORT = 29500


def static_args(network, node_rank: int, *extra: str, script: str = ALLREDUCE) -> list[str]:
    return [
        "--nnodes", "2",
        "--nproc-per-node", "2",
        "--node-rank", str(node_rank),
        "--master-addr", network[0].addr,
        "--master-port", str(MASTER_PORT),
        "--local-addr", network[node_rank].addr,
        *extra,
        script,
    ]


@pytest.mark.timeout(120)
def test_static_two_nodes_all_reduce(make_network, start_agent):
    """(a) 2 hosts x 2 workers: every one of the 4 ranks gets the same all_reduce sum (1+2+3+4)."""
    net = make_network(2)
    agents = [start_agent(net[r], static_args(net, r, "--rdzv-conf", "timeout=60")) for r in (0, 1)]
    wait_all(agents, 90)
    lines = "\n".join(agent.stdout for agent in agents)
    seen = all_reduce_ranks(lines, 4)
    assert sorted(seen) == [0, 1, 2, 3], lines
    # Ranks 0-1 run on node 0, ranks 2-3 on node 1.
    assert seen == {0: "0", 1: "0", 2: "1", 3: "1"}, lines


@pytest.mark.timeout(60)
@pytest.mark.parametrize("why", ["refused", "unreachable"])
def test_static_node_without_master_fails_within_timeout(make_network, start_agent, why):
    """(b) node 1 started without node 0 (host 0 up with nothing listening, or cut off so that
    connections time out): a clear error naming the master within the static ``timeout``, no hang."""
    net = make_network(2)
    if why == "unreachable":
        net[0].cut()
    agent = start_agent(net[1], static_args(net, 1, "--rdzv-conf", "timeout=5"))
    code = agent.wait(30)
    assert code != 0, agent.describe()
    assert agent.elapsed < 5 + 15, f"took {agent.elapsed:.1f} s\n{agent.describe()}"
    assert "Traceback" not in agent.stderr, agent.describe()
    assert f"{net[0].addr}:{MASTER_PORT}" in agent.stderr, agent.describe()
    assert re.search(r"\b5(\.0)? ?s(econds)?\b", agent.stderr), agent.describe()


@pytest.mark.timeout(120)
def test_node_that_finished_leaves_its_exit_barrier_when_the_other_node_fails(make_network, start_agent, tmp_path):
    """Node 0 (the store's host) finishes; node 1's workers then fail. Node 1 closes the job for
    every node: node 0 leaves its exit barrier at once (not after exit_barrier_timeout, 300 s),
    reports node 1's failure as the root cause, and exits 1; so does node 1."""
    net = make_network(2)
    # Node 1 fails only once node 0's workers are gone: a collective would fail as soon as they
    # close their connections, while they still run, and node 0 would then stop them (exit 1).
    (tmp_path / "finished").mkdir()
    env = {"MN_EXIT_RANKS": "0,1", "MN_PG_TIMEOUT": "20", "MN_FAIL_AFTER_EXITS": str(tmp_path / "finished")}
    agents = [start_agent(net[r], static_args(net, r, "--rdzv-conf", "timeout=60", "--monitor-interval", "0.2",
                                              script=FAILING), env=env)
              for r in (0, 1)]
    codes = wait_all(agents, 90, expect=None)
    assert codes == [1, 1], "\n".join(a.describe(80) for a in agents)
    finished = agents[0]
    assert "every worker of this node succeeded, but the job ended on another node" in finished.stderr, \
        finished.describe(80)
    assert re.search(r"launcher: the job failed on .*\(node 1, ", finished.stderr), finished.describe(80)
    assert "Root cause" in agents[1].stderr, agents[1].describe(80)


UNEVEN = """
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], "rank" + os.environ["RANK"]).write_text("started")
if os.environ["GROUP_RANK"] == "1":
    time.sleep(90)
"""


@pytest.mark.timeout(120)
def test_sigterm_at_the_exit_barrier_ends_the_wait_and_the_job(make_network, start_agent, tmp_path):
    """Node 0's workers finish while node 1's run on; node 0 waits at its exit barrier. SIGTERM to
    node 0's agent ends that wait at once (not after exit_barrier_timeout), says so, exits
    128+15; node 1 is not left running its workers for the whole job."""
    net = make_network(2)
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN)
    marks = tmp_path / "marks"
    marks.mkdir()
    agents = []
    for r in (0, 1):
        argv = static_args(net, r, "--rdzv-conf", "timeout=60", "--monitor-interval", "0.2", script=str(script))
        agents.append(start_agent(net[r], [*argv, str(marks)]))
    deadline = time.monotonic() + 60
    while len(list(marks.iterdir())) < 4:
        assert time.monotonic() < deadline, "\n".join(a.describe(80) for a in agents)
        assert all(a.poll() is None for a in agents), "\n".join(a.describe(80) for a in agents)
        time.sleep(0.1)
    # Node 0's workers have exited: once its agent says it waits at the exit barrier (an event, not a delay).
    while "waiting at the exit barrier" not in agents[0].stderr:
        assert time.monotonic() < deadline, agents[0].describe(80)
        assert agents[0].poll() is None, agents[0].describe(80)
        time.sleep(0.05)
    assert agents[0].poll() is None, agents[0].describe(80)
    agents[0].kill(signal.SIGTERM)
    assert agents[0].wait(15) == 128 + signal.SIGTERM, agents[0].describe(80)
    assert "received SIGTERM while waiting for the other nodes to finish" in agents[0].stderr, agents[0].describe(80)
    assert agents[1].wait(30) != 0, agents[1].describe(80)
