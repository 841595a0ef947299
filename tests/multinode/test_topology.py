"""--topology across four namespace hosts: group ranks consecutive per leaf switch (issue 47).

The site file puts the hosts on two leaves with their addresses interleaved (.1 and .3 on one,
.2 and .4 on the other), so torchrun's order (by address) would alternate leaves at every rank.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.multinode.harness import SCRIPTS, wait_all, wait_until

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


SEGMENT_WORKER = str(SCRIPTS / "segment_worker.py")
#: A spare that arrives once the round is closed proves the site's secret to wait inside the
#: c10d store (docs/store-security.md).
SECRET = {"LAUNCHER_RDZV_SECRET": "segment-test-secret-0123456789abcdef"}


def _placed(state: Path) -> list[tuple[str, int, int]]:
    path = state / "placed.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(addr, int(rank), int(world)) for addr, rank, world in (line.split() for line in lines)]


@pytest.mark.timeout(150)
def test_segments_train_inside_one_leaf_and_a_spare_of_that_leaf_replaces_a_lost_node(
    make_network, start_agent, tmp_path: Path
) -> None:
    """--segment 2 --nnodes 2 on four hosts, three on leaf-a and one on leaf-b: the job trains in
    leaf-a (leaf-b has no whole segment), the other two wait as spares; a killed node of the
    segment is replaced by leaf-a's spare, and the spare left exits 0 when the job ends."""
    net = make_network(4)
    leaf_of = {net[i].addr: ("leaf-a" if i < 3 else "leaf-b") for i in range(4)}
    site = tmp_path / "site.txt"
    site.write_text("".join(f"{addr} spine0.{leaf}\n" for addr, leaf in leaf_of.items()))
    state = tmp_path / "state"
    state.mkdir()

    def start(i: int):
        return start_agent(net[i], [
            "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", net[0].endpoint(29400), "--rdzv-id", "segments",
            "--rdzv-conf", "join_timeout=60,last_call_timeout=30,keep_alive_interval=0.5,heartbeat_timeout=10",
            "--local-addr", net[i].addr, "--monitor-interval", "0.2", "--max-restarts", "3",
            "--topology", f"file:{site}", "--segment", "2", SEGMENT_WORKER, str(state), net[i].addr,
        ], name=f"segment-{i}", env=SECRET)

    def logs() -> str:
        return "\n".join(agent.describe() for agent in agents.values())

    # leaf-b's node first: alone, it is no segment, and leaf-a's two close the round at once.
    agents = {i: start(i) for i in (3, 1, 0)}
    wait_until(lambda: len(_placed(state)) == 2, 60, "leaf-a's segment to start", on_timeout=logs)
    assert sorted(_placed(state)) == sorted([(net[0].addr, 0, 2), (net[1].addr, 1, 2)]), logs()
    agents[2] = start(2)  # leaf-a's third node: the round is closed, it waits as a spare
    for i in (2, 3):
        wait_until(lambda i=i: "waiting as a spare" in agents[i].stderr, 60, f"node {i} to wait as a spare",
                   on_timeout=logs)

    agents[1].kill()  # not node 0: it serves the store
    wait_until(lambda: any(addr == net[2].addr for addr, _, _ in _placed(state)), 60,
               "leaf-a's spare to take the lost node's place", on_timeout=logs)
    assert (net[2].addr, 1, 2) in _placed(state), logs()
    assert "this spare is called" in agents[2].stderr, agents[2].describe()
    (state / "finish").touch()
    wait_all([agents[0], agents[2], agents[3]], 60, context=list(agents.values()))
    assert all(addr != net[3].addr for addr, _, _ in _placed(state)), "leaf-b's node never trains"
