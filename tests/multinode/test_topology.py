"""--topology across four namespace hosts: group ranks consecutive per leaf switch (issue 47).

The site file puts the hosts on two leaves with their addresses interleaved (.1 and .3 on one,
.2 and .4 on the other), so torchrun's order (by address) would alternate leaves at every rank.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.multinode.harness import SCRIPTS, wait_all

pytestmark = [pytest.mark.netns, pytest.mark.slow]

WORKER = str(SCRIPTS / "placement_worker.py")


def _job(net, start_agent, run_id: str, extra: list[str]) -> tuple[dict[str, tuple[int, int]], str]:
    """Run one job of four agents (one worker each): each host's address -> (RANK, GROUP_RANK), and their logs."""
    endpoint = net[0].endpoint(29400)
    agents = [
        start_agent(host, ["--nnodes", "4", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                           "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--rdzv-conf", "join_timeout=60",
                           "--local-addr", host.addr, "--monitor-interval", "0.2", *extra, WORKER],
                    name=f"{run_id}-{host.name}")
        for host in (net[3], net[1], net[2], net[0])  # a join order that is neither of the two answers
    ]
    wait_all(agents, 90)
    placed = {}
    for agent in agents:
        found = re.search(r"placed RANK=(\d+) GROUP_RANK=(\d+) WORLD_SIZE=4", agent.stdout)
        assert found, agent.describe()
        placed[agent.host.addr] = (int(found.group(1)), int(found.group(2)))
    return placed, "\n".join(agent.stderr for agent in agents)


@pytest.mark.timeout(180)
def test_group_ranks_follow_the_leaves(make_network, start_agent, tmp_path: Path) -> None:
    net = make_network(4)
    leaf_of = {net[i].addr: ("leaf-a" if i % 2 == 0 else "leaf-b") for i in range(4)}
    site = tmp_path / "site.txt"
    site.write_text("# two leaves under one spine, addresses interleaved\n"
                    + "".join(f"{addr} spine0.{leaf}\n" for addr, leaf in leaf_of.items()))

    placed, logs = _job(net, start_agent, "topo-on", ["--topology", f"file:{site}"])
    by_rank = sorted(placed, key=lambda addr: placed[addr][1])
    assert [leaf_of[a] for a in by_rank] == ["leaf-a", "leaf-a", "leaf-b", "leaf-b"], placed
    assert all(rank == group for rank, group in placed.values())  # one worker a node: RANK == GROUP_RANK
    assert [placed[net[i].addr][1] for i in range(4)] == [0, 2, 1, 3]  # within a leaf: the file's order
    # Each node's INFO line names its path; the closer's names every node's path and rank.
    for addr, (_, group) in placed.items():
        assert re.search(rf"this node {re.escape(addr)}_\d+_\d+ is group rank {group} at spine0\.{leaf_of[addr]}", logs)
    assert re.search(r"placed by topology \(group rank, node, path\): 0 \S+ at spine0\.leaf-a, 1 ", logs), logs

    plain, logs = _job(net, start_agent, "topo-off", [])
    assert [plain[net[i].addr][1] for i in range(4)] == [0, 1, 2, 3]  # torchrun's order: by address
    assert "placed by topology" not in logs and " at spine0" not in logs
