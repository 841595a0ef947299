"""``--topology slurm`` under real Slurm with the ``topology/tree`` plugin.

Four virtual nodes of this host (``t1`` to ``t4``) under two leaf switches, interleaved so that
Slurm's own node order (t1, t2, t3, t4) alternates between them: ``leaf0`` holds t1 and t3,
``leaf1`` t2 and t4. One launcher per node through ``srun``, with no flag beyond ``--topology
slurm`` (the environment gives the rest, and ``--topology`` makes it the c10d rendezvous): each
task's ``SLURM_TOPOLOGY_ADDR`` is set by Slurm itself (``spine.leaf0.t1``), and the group ranks
come out consecutive per leaf switch.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clusters.schedulers import SlurmCluster, ensure_packages
from tests.conftest import launcher_env

pytestmark = pytest.mark.timeout(240)

NODES = ("t1", "t2", "t3", "t4")
TOPOLOGY = """\
SwitchName=leaf0 Nodes=t1,t3
SwitchName=leaf1 Nodes=t2,t4
SwitchName=spine Switches=leaf0,leaf1
"""

WORKER = """\
import os
print("group", os.environ["GROUP_RANK"], "rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"],
      "node", os.environ["SLURMD_NODENAME"], "procid", os.environ["SLURM_PROCID"],
      "addr", os.environ.get("SLURM_TOPOLOGY_ADDR", "-"), "pattern", os.environ.get("SLURM_TOPOLOGY_ADDR_PATTERN", "-"),
      flush=True)
"""


@pytest.fixture(scope="module")
def tree_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """slurmctld with topology/tree and four slurmd under two leaf switches."""
    reason = ensure_packages("slurm")
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm-tree"), nodes=NODES, topology=TOPOLOGY)
    try:
        cluster.start()
    except RuntimeError as exc:
        pytest.skip(f"cannot start a Slurm cluster here: {str(exc).splitlines()[0]}")
    try:
        yield cluster
    finally:
        cluster.stop()


def test_slurm_gives_each_task_its_switch_path(tree_cluster: SlurmCluster) -> None:
    """What the source reads is Slurm's own: the tree plugin's address and pattern, per node."""
    result = tree_cluster.run("srun", "-N4", "--ntasks-per-node=1", "sh", "-c",
                              'echo "$SLURMD_NODENAME $SLURM_TOPOLOGY_ADDR $SLURM_TOPOLOGY_ADDR_PATTERN"')
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "t1 spine.leaf0.t1 switch.switch.node", "t2 spine.leaf1.t2 switch.switch.node",
        "t3 spine.leaf0.t3 switch.switch.node", "t4 spine.leaf1.t4 switch.switch.node"], result


def test_topology_slurm_places_ranks_by_leaf_switch(tree_cluster: SlurmCluster, tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    result = tree_cluster.run("srun", "-N4", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                              sys.executable, "-m", "launcher", "--topology", "slurm", str(worker),
                              env=launcher_env(), timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    ranks = re.findall(r"^group (\d) rank (\d) of 4 node (t\d) procid (\d) addr (\S+) pattern (\S+)$",
                       result.stdout, re.MULTILINE)
    assert len(ranks) == 4, output
    by_group = {int(group): (node, addr) for group, _, node, _, addr, _ in ranks}
    # Consecutive per leaf switch (leaf0 first: path order), inside a leaf by the node's number;
    # Slurm's own order (SLURM_PROCID, the static rendezvous' node rank) alternates leaves.
    assert by_group == {0: ("t1", "spine.leaf0.t1"), 1: ("t3", "spine.leaf0.t3"),
                        2: ("t2", "spine.leaf1.t2"), 3: ("t4", "spine.leaf1.t4")}, output
    assert {node: int(procid) for _, _, node, procid, _, _ in ranks} == {"t1": 0, "t2": 1, "t3": 2, "t4": 3}
    # The environment chose the rendezvous: c10d, because --topology asks the round to be ordered.
    assert len(re.findall(r"Slurm job \d+: 4 nodes, c10d rendezvous at \S+", output)) == 4, output
    # The closer's INFO line names every node's group rank and path.
    placed = re.findall(r"placed by topology \(group rank, node, path\): (.*)", output)
    assert len(placed) == 1, output
    assert [p for p in re.findall(r"spine\.leaf\d", placed[0])] == ["spine.leaf0"] * 2 + ["spine.leaf1"] * 2, output
