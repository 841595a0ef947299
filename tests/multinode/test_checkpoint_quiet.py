"""A rank waiting for a checkpoint on another node is not hung (``--hang-timeout auto``, issue 46).

Two namespace hosts, one rank each, a plain DDP job over gloo with no launcher call: rank 0
checkpoints (``torch.save``) for 6 s, twice the learned steady timeout, while the other node's rank
waits in the next all-reduce. Its node learns of the checkpoint through the round's ``quiet`` key,
read only once its rank would otherwise be hung.
"""

from __future__ import annotations

import re

import pytest

from tests.hangs.test_checkpoint_quiet import DDP
from tests.multinode.harness import wait_all

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
]

RDZV_PORT = 29400


@pytest.mark.timeout(150)
def test_a_rank_waiting_for_a_checkpoint_on_another_node_is_not_hung(make_network, start_agent, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    net = make_network(2)
    args = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(RDZV_PORT), "--rdzv-id", "mn-checkpoint", "--rdzv-conf", "join_timeout=60",
        "--monitor-interval", "0.2", "--hang-timeout", "auto", "--hang-start-timeout", "600", "--hang-floor", "3",
    ]
    env = {"TMPDIR": str(tmp_path)}
    agents = [start_agent(net[i], [*args, "--local-addr", net[i].addr, str(script), "110", "80:6", "save"], env=env)
              for i in (0, 1)]
    codes = wait_all(agents, 130, expect=None)
    detail = "\n".join(a.describe(80) for a in agents)
    assert codes == [0, 0], detail
    assert not any("hang detected" in agent.stderr for agent in agents), detail
    # Both nodes learned a steady timeout before the checkpoint (3 s, the floor), so the waiting
    # rank's 6 s of silence would have been a hang; the checkpoint's node learned its length.
    for agent in agents:
        assert re.search(r"hang timeout \(steady\) learned: 3 s", agent.stderr), detail
    assert any(re.search(r"hang timeout \(checkpoint\) learned: [\d.]+ s \(5 x the longest checkpoint, [\d.]+ s\)",
                         agent.stderr) for agent in agents), detail
