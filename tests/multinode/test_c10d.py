"""The c10d backend across namespace hosts: fixed size, endpoint down, IPv6."""

from __future__ import annotations

import pytest

from tests.multinode.harness import ALLREDUCE, all_reduce_ranks, wait_all

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
]

RDZV_PORT = 29400


def c10d_args(network, index: int, *, nnodes: str = "2", conf: str = "join_timeout=60", run_id: str = "mn-job",
              endpoint: str | None = None) -> list[str]:
    host = network[index]
    return [
        "--nnodes", nnodes,
        "--nproc-per-node", "2",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint or network[0].endpoint(RDZV_PORT),
        "--rdzv-id", run_id,
        "--rdzv-conf", conf,
        "--local-addr", host.addr,
        "--monitor-interval", "0.2",
        ALLREDUCE,
    ]


def check_fixed_size_job(net, start_agent, **kwargs) -> None:
    agents = [start_agent(net[i], c10d_args(net, i, **kwargs)) for i in (0, 1)]
    wait_all(agents, 90)
    ranks = all_reduce_ranks("\n".join(a.stdout for a in agents), 4)
    assert sorted(ranks) == [0, 1, 2, 3], "\n".join(a.describe() for a in agents)
    # Two workers per node, consecutive global ranks per node.
    assert sorted(ranks.values()) == ["0", "0", "1", "1"]
    assert ranks[0] == ranks[1] and ranks[2] == ranks[3]


@pytest.mark.timeout(120)
def test_c10d_two_nodes_fixed_size(make_network, start_agent):
    """(c) --nnodes 2 over c10d: the host of the endpoint serves the store, 4 ranks all_reduce."""
    check_fixed_size_job(make_network(2), start_agent)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("why", ["refused", "unreachable"])
def test_c10d_endpoint_down_at_start(make_network, start_agent, why):
    """(g) nothing serves the endpoint (its host runs no agent, or is cut off): a one-line error
    within join_timeout, non-zero exit, no traceback."""
    net = make_network(2)
    if why == "unreachable":
        net[0].cut()
    agent = start_agent(net[1], c10d_args(net, 1, conf="join_timeout=5"))
    code = agent.wait(40)
    assert code != 0, agent.describe()
    assert agent.elapsed < 5 + 15, f"took {agent.elapsed:.1f} s (join_timeout=5)\n{agent.describe()}"
    assert "Traceback" not in agent.stderr, agent.describe()
    assert net[0].endpoint(RDZV_PORT) in agent.stderr, agent.describe()
    assert "join_timeout" in agent.stderr, agent.describe()


@pytest.mark.timeout(120)
def test_c10d_two_nodes_ipv6_endpoint(make_network, start_agent):
    """(h) IPv6-only hosts (ULA fd00:213::/64): endpoint ``[fd00:213::1]:29400``, gloo over IPv6."""
    net = make_network(2, ipv4=False, ipv6=True)
    assert net[0].endpoint(RDZV_PORT) == f"[fd00:213::1]:{RDZV_PORT}"
    check_fixed_size_job(net, start_agent)
