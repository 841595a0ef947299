"""The static backend across two namespace hosts (fixed size, ranks given by --node-rank)."""

from __future__ import annotations

import re

import pytest

from tests.multinode.harness import ALLREDUCE, all_reduce_ranks, wait_all

pytestmark = [pytest.mark.netns, pytest.mark.slow]

MASTER_PORT = 29500


def static_args(network, node_rank: int, *extra: str) -> list[str]:
    return [
        "--nnodes", "2",
        "--nproc-per-node", "2",
        "--node-rank", str(node_rank),
        "--master-addr", network[0].addr,
        "--master-port", str(MASTER_PORT),
        "--local-addr", network[node_rank].addr,
        *extra,
        ALLREDUCE,
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
