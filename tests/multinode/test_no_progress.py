"""``--max-no-progress-restarts`` across two namespace hosts: every node stops in the same round,
with exit status 93, naming the same step, though only one node's workers ever failed (the other
only re-formed, charging no restart: the verdict is the group's, agreed with the ranks)."""

from __future__ import annotations

import pytest

from tests.multinode.harness import free_port, wait_all

pytestmark = [pytest.mark.netns, pytest.mark.slow]

#: Every rank gives steps 1 to 41; node 1's ranks then fail, node 0's wait to be stopped for the
#: re-form. The wait for the agent's step directory: see tests/failures/test_no_progress.py.
WORKER = """
import os, sys, time
import launcher
from launcher.hangs.progress import step_dirs
from launcher.recovery import own_token

print(f"attempt {os.environ['TORCHELASTIC_RESTART_COUNT']} rank {os.environ['RANK']}", flush=True)
deadline = time.monotonic() + 60
while not any(os.path.isdir(d) for d in step_dirs(own_token())) and time.monotonic() < deadline:
    time.sleep(0.01)
for step in range(1, 42):
    launcher.heartbeat(step)
if os.environ["GROUP_RANK"] == "1":
    sys.exit(3)
time.sleep(120)
"""


@pytest.mark.timeout(150)
def test_both_nodes_stop_naming_the_same_step(make_network, start_agent, tmp_path):
    net = make_network(2)
    script = tmp_path / "train.py"
    script.write_text(WORKER)
    port = free_port(net[0])
    agents = [start_agent(net[i], [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(port), "--rdzv-id", "no-progress",
        "--rdzv-conf", "join_timeout=60", "--local-addr", net[i].addr,
        "--monitor-interval", "0.2", "--max-restarts", "5", "--max-no-progress-restarts", "2", str(script),
    ]) for i in (0, 1)]
    wait_all(agents, 120, expect=93)
    line = ("no progress in 2 restarts in a row: each ended before passing step 41 (the furthest the job "
            "reached); not restarting (exit 93: do not requeue)")
    for agent in agents:
        assert line in agent.stderr.strip().splitlines()[-1], agent.describe()
    # Node 1 charged a restart for each failure: attempts 0, 1 and 2 ran, the verdict came as the
    # round of restart 3 formed, before its workers started. Node 0 only re-formed (its count stays 0).
    assert "attempt 2 rank 2" in agents[1].stdout and "attempt 3" not in agents[1].stdout, agents[1].describe()
    assert agents[0].stdout.count("attempt 0 rank 0") == 3, agents[0].describe()
