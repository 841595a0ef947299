"""Preemption across namespace hosts: the notice reaches every rank of a 2-node job within a
second, the ranks save within the grace, the agents exit with status 75, nothing is left."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from tests.multinode.harness import SCRIPTS, AgentProcess, wait_all, wait_until
from tests.multinode.netns import Network

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
]

PREEMPT_WORKER = str(SCRIPTS / "preempt_worker.py")
RDZV_PORT = 29400
PREEMPTED = 75
#: What the issue asks: every rank sees the notice within a second of the signal.
NOTICE_BOUND = 1.0


def _start_job(net: Network, start_agent, tmp_path: Path, run_id: str, *extra: str,
               env: dict[str, str] | None = None) -> tuple[list[AgentProcess], Path]:
    state = tmp_path / "state"
    state.mkdir()
    args = [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(RDZV_PORT), "--rdzv-id", run_id, "--rdzv-conf", "join_timeout=60",
        "--monitor-interval", "0.2", *extra,
    ]
    agent_env = {"STATE_DIR": str(state), "TMPDIR": str(tmp_path), **(env or {})}
    agents = [start_agent(net[i], [*args, "--local-addr", net[i].addr, PREEMPT_WORKER], env=agent_env)
              for i in (0, 1)]
    wait_until(lambda: len(list(state.glob("ready-*"))) == 4 or any(a.poll() is not None for a in agents), 90,
               "every rank to be ready", on_timeout=lambda: "\n".join(a.describe() for a in agents))
    assert len(list(state.glob("ready-*"))) == 4, "\n".join(a.describe() for a in agents)
    return agents, state


def _seen(state: Path, rank: int) -> dict[str, float]:
    return dict(json.loads((state / f"seen-{rank}").read_text()))


def _nothing_left(net: Network) -> None:
    for host in (net[0], net[1]):
        wait_until(lambda h=host: not h.pids(), 10, f"every process in {host.netns} to end",
                   on_timeout=lambda h=host: f"still running: {h.pids()}")


@pytest.mark.timeout(150)
def test_sigterm_to_every_agent_every_rank_saves_within_the_grace(make_network, start_agent, tmp_path):
    """Kubernetes' way: every pod's agent gets SIGTERM."""
    net = make_network(2)
    grace = 30.0
    agents, state = _start_job(net, start_agent, tmp_path, "mn-preempt-all", "--preemption-grace", str(grace))
    sent = time.time()
    for agent in agents:
        agent.kill(signal.SIGTERM)
    codes = wait_all(agents, grace + 30, expect=None)
    detail = "\n".join(a.describe() for a in agents)
    assert codes == [PREEMPTED, PREEMPTED], detail
    for rank in range(4):
        seen = _seen(state, rank)
        assert seen["time"] - sent < NOTICE_BOUND, (rank, seen, detail)
        assert 0 < seen["left"] <= grace, (rank, seen, detail)
        assert (state / f"ckpt-{rank}").exists(), detail
    for agent in agents:
        # Every worker saved and left by itself: the agent did not wait out the grace.
        assert agent.elapsed < 90 and time.time() - sent < grace, detail
        assert re.search(r"job preempted \(SIGTERM received here\); 2 of 2 local worker\(s\) exited cleanly "
                         r"within the 30 s grace; exit status 75", agent.stderr), detail
        assert "ERROR" not in agent.stderr and "Traceback" not in agent.stderr, detail
    _nothing_left(net)


@pytest.mark.timeout(150)
def test_a_signal_to_one_node_reaches_the_ranks_of_both(make_network, start_agent, tmp_path):
    """Slurm's ``--signal=B:`` and a drained Kubernetes node signal only some agents."""
    net = make_network(2)
    agents, state = _start_job(net, start_agent, tmp_path, "mn-preempt-one", "--preemption-signals", "SIGUSR1",
                               "--preemption-grace", "30")
    sent = time.time()
    agents[1].kill(signal.SIGUSR1)
    codes = wait_all(agents, 60, expect=None)
    detail = "\n".join(a.describe() for a in agents)
    assert codes == [PREEMPTED, PREEMPTED], detail
    for rank in range(4):
        assert _seen(state, rank)["time"] - sent < NOTICE_BOUND, (rank, _seen(state, rank), detail)
        assert (state / f"ckpt-{rank}").exists(), detail
    assert "job preempted (SIGUSR1 received here)" in agents[1].stderr, detail
    received_by = rf"job preempted \(SIGUSR1 received by {re.escape(net[1].addr)}_\S+ \(node 1\)\)"
    assert re.search(received_by, agents[0].stderr), detail
    _nothing_left(net)


@pytest.mark.timeout(150)
def test_a_worker_that_ignores_the_notice_is_stopped_at_the_end_of_the_grace(make_network, start_agent, tmp_path):
    net = make_network(2)
    grace = 3.0
    agents, state = _start_job(net, start_agent, tmp_path, "mn-preempt-ignore", "--preemption-grace", str(grace),
                               "--shutdown-timeout", "5", env={"IGNORE_RANK": "3"})
    sent = time.time()
    for agent in agents:
        agent.kill(signal.SIGTERM)
    codes = wait_all(agents, 60, expect=None)
    ended = time.time() - sent
    detail = "\n".join(a.describe() for a in agents)
    assert codes == [PREEMPTED, PREEMPTED], detail
    assert ended >= grace, detail  # node B waited out the grace for rank 3
    for rank in range(3):
        assert (state / f"ckpt-{rank}").exists(), detail
    assert not (state / "ckpt-3").exists(), detail
    assert "2 of 2 local worker(s) exited cleanly" in agents[0].stderr, detail
    node_b = agents[1].stderr
    assert "1 of 2 local worker(s) exited cleanly within the 3 s grace; exit status 75" in node_b, detail
    assert re.search(r"local rank 1 \(rank 3, pid \d+\) ignored the notice: still running at the end of the grace, "
                     r"it was sent SIGTERM and was killed by SIGTERM", node_b), detail
    _nothing_left(net)


@pytest.mark.timeout(120)
def test_preempted_while_waiting_for_the_other_node(make_network, start_agent, tmp_path):
    """No worker runs yet (the rendezvous waits for node B): nothing to save, still "preempted",
    at once (the signal ends a store call midway: the client must not wait for its reply later)."""
    net = make_network(2)
    args = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", net[0].endpoint(RDZV_PORT), "--rdzv-id", "mn-preempt-early",
            "--rdzv-conf", "join_timeout=60", "--preemption-grace", "30", "--local-addr", net[0].addr, PREEMPT_WORKER]
    agent = start_agent(net[0], args, env={"STATE_DIR": str(tmp_path), "TMPDIR": str(tmp_path)})
    wait_until(lambda: "joined round 0" in agent.stderr or agent.poll() is not None, 60, "node A to wait for node B",
               on_timeout=agent.describe)
    agent.kill(signal.SIGTERM)
    assert agent.wait(30) == PREEMPTED, agent.describe()
    assert re.search(r"job preempted \(SIGTERM received here\) while no worker ran; exit status 75", agent.stderr), \
        agent.describe()
    assert "Traceback" not in agent.stderr, agent.describe()
    _nothing_left(net)
