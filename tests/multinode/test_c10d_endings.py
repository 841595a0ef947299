"""How a 2-node c10d job ends, on every node: cleanly, or with the root cause named everywhere.

Node 0 serves the rendezvous store (the endpoint is its address); node 1 is a client. Each
test asserts what both agents printed, their exit codes, and that no agent printed a C++
trace (torch's TCPStore client is not in the agents any more: only workers load torch).
"""

from __future__ import annotations

import re
import signal

import pytest

from tests.multinode.harness import AGENT_MODULES, ALLREDUCE, FAILING, all_reduce_ranks, wait_all, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.slow]

RDZV_PORT = 29400
#: Short liveness and store timeouts, so that a dead or cut-off node is noticed within seconds.
CONF = "join_timeout=20,read_timeout=5,keep_alive_interval=0.5,heartbeat_timeout=3,close_timeout=15"
#: What torch's C++ store client prints when its server goes away under it.
CPP_TRACE = re.compile(r"recvValue|sendBytes|Exception raised from|frame #\d|c10::")
WORKER_LINE = re.compile(r"^\[default\d+\]:")


def agent_lines(text: str) -> str:
    """The agent's own lines (workers' lines carry the ``[default<n>]:`` prefix)."""
    return "\n".join(line for line in text.splitlines() if not WORKER_LINE.match(line))


def args(net, index: int, script: str, run_id: str) -> list[str]:
    return [
        "--nnodes", "2",
        "--nproc-per-node", "2",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(RDZV_PORT),
        "--rdzv-id", run_id,
        "--rdzv-conf", CONF,
        "--local-addr", net[index].addr,
        "--monitor-interval", "0.2",
        script,
    ]


def start_pair(net, start_agent, script: str, run_id: str, env: dict[str, str] | None = None):
    return [start_agent(net[i], args(net, i, script, run_id), name=f"node{i}", env=env) for i in (0, 1)]


def assert_no_cpp_trace(agents) -> None:
    for agent in agents:
        found = CPP_TRACE.search(agent_lines(agent.stderr))
        assert found is None, f"C++ trace in {agent.name}'s output\n{agent.describe(80)}"


def assert_ranks_listed(agent, states: dict[int, str]) -> None:
    """The agent's report lists each of its ranks with the given state."""
    text = agent.stderr
    assert "Ranks on this node" in text, agent.describe(80)
    for rank, state in states.items():
        row = re.search(rf"^\s+{rank}\s+\d+\s+\d+\s+(failed|killed by the agent|succeeded|running)\b", text, re.M)
        assert row is not None and row.group(1) == state, f"rank {rank} should be {state!r}\n{agent.describe(80)}"


def wait_ready(agents, ranks: int = 4) -> None:
    wait_until(
        lambda: sum("ready" in a.stdout for a in agents) >= 2
        and len(re.findall(r"rank \d+ ready", "".join(a.stdout for a in agents))) >= ranks,
        90,
        "every worker to form the group",
        on_timeout=lambda: "\n".join(a.describe() for a in agents),
    )


@pytest.mark.timeout(400)
def test_successful_runs_end_quietly_and_agents_never_load_torch(make_network, start_agent, tmp_path):
    """3 successful 2-node jobs in a row: exit 0 on both nodes, no warning, no C++ trace, and
    neither agent process ever imported torch (only the workers did)."""
    net = make_network(2)
    for attempt in range(3):
        notes = [tmp_path / f"modules-{attempt}-{i}" for i in (0, 1)]
        agents = [
            start_agent(net[i], args(net, i, ALLREDUCE, f"quiet-{attempt}"), name=f"run{attempt}-node{i}",
                        env={"MN_MODULES_FILE": str(notes[i])}, program=(AGENT_MODULES,))
            for i in (0, 1)
        ]
        wait_all(agents, 120)
        assert sorted(all_reduce_ranks("\n".join(a.stdout for a in agents), 4)) == [0, 1, 2, 3]
        for agent, note in zip(agents, notes, strict=True):
            own = agent_lines(agent.stderr)
            assert "WARNING" not in own and "ERROR" not in own, agent.describe(80)
            assert "could not announce" not in own, agent.describe(80)
            assert note.read_text().strip() == "torch loaded: False", agent.describe(80)
        assert_no_cpp_trace(agents)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("failing_node", [0, 1], ids=["on-store-host", "on-other-node"])
def test_worker_failure_is_named_on_every_node(make_network, start_agent, failing_node):
    """A worker fails (exit 7) on one node: both nodes name it as the root cause (node, global
    rank, exit code, its stderr line) and list their own ranks with their states."""
    net = make_network(2)
    fail_rank = 2 * failing_node + 1
    agents = start_pair(net, start_agent, FAILING, f"fail-{failing_node}",
                        env={"MN_FAIL_RANK": str(fail_rank), "MN_FAIL_CODE": "7", "MN_FAIL_AFTER": "2"})
    codes = wait_all(agents, 150, expect=None)
    assert codes == [1, 1], "\n".join(a.describe(80) for a in agents)
    for agent in agents:
        text = agent.stderr
        root = text[text.index("Root cause"):] if "Root cause" in text else ""
        assert root, agent.describe(80)
        assert re.search(rf"node\s+: .*\(node {failing_node}, {re.escape(net[failing_node].addr)}\)", root), \
            agent.describe(80)
        assert re.search(rf"rank\s+: {fail_rank} \(local rank 1", root), agent.describe(80)
        assert "exit code 7" in root, agent.describe(80)
        assert f"boom: rank {fail_rank} gives up" in root, agent.describe(80)
    failing, other = agents[failing_node], agents[1 - failing_node]
    base = 2 * failing_node
    assert_ranks_listed(failing, {base: "killed by the agent", base + 1: "failed"})
    other_base = 2 * (1 - failing_node)
    # The other node's workers were stopped by their agent, or failed when their peer went away.
    for rank in (other_base, other_base + 1):
        assert re.search(rf"^\s+{rank}\s+\d+\s+\d+\s+(killed by the agent|failed)\b", other.stderr, re.M), \
            other.describe(80)
    assert_no_cpp_trace(agents)


@pytest.mark.timeout(240)
def test_store_host_killed(make_network, start_agent):
    """Node 0 (the store's host) dies outright: node 1 says in one line that the rendezvous store
    on node 0 is gone, reports its own ranks, and exits 1."""
    net = make_network(2)
    agents = start_pair(net, start_agent, FAILING, "host-killed")
    wait_ready(agents)
    net[0].kill_all(signal.SIGKILL)
    code = agents[1].wait(120)
    assert code == 1, agents[1].describe(80)
    text = agents[1].stderr
    gone = [line for line in text.splitlines()
            if f"the rendezvous store on {net[0].endpoint(RDZV_PORT)} (node 0) is gone" in line]
    assert gone, agents[1].describe(80)
    assert "Ranks on this node" in text, agents[1].describe(80)
    for rank in (2, 3):
        assert re.search(rf"^\s+{rank}\s+\d+\s+\d+\s+(killed by the agent|failed)\b", text, re.M), \
            agents[1].describe(80)
    assert not re.search(r"^Traceback", agent_lines(text), re.M), agents[1].describe(80)
    assert_no_cpp_trace(agents[1:])


@pytest.mark.timeout(240)
def test_link_cut(make_network, start_agent):
    """Node 1's cable is pulled: node 1 says the store on node 0 is gone (no answer) and lists its
    ranks; node 0 names node 1 as lost. Both exit 1, without C++ traces."""
    net = make_network(2)
    agents = start_pair(net, start_agent, FAILING, "link-cut", env={"MN_PG_TIMEOUT": "60"})
    wait_ready(agents)
    net[1].cut()
    codes = wait_all(agents, 150, expect=None)
    assert codes == [1, 1], "\n".join(a.describe(80) for a in agents)
    cut_off, host = agents[1], agents[0]
    assert f"the rendezvous store on {net[0].endpoint(RDZV_PORT)} (node 0) is gone" in cut_off.stderr, \
        cut_off.describe(80)
    assert "Ranks on this node" in cut_off.stderr, cut_off.describe(80)
    assert net[1].addr in agent_lines(host.stderr), host.describe(80)
    assert re.search(r"lost|no heartbeat", agent_lines(host.stderr)), host.describe(80)
    assert "Ranks on this node" in host.stderr, host.describe(80)
    assert_no_cpp_trace(agents)


@pytest.mark.timeout(240)
def test_other_node_failing_while_this_one_waits_at_the_exit_barrier(make_network, start_agent, tmp_path):
    """Node 1's workers finish; node 0's then fail (their peers are gone). Node 1 leaves its exit
    barrier as soon as node 0 ends the job (not after exit_barrier_timeout), and exits 1 with node
    0's root cause (its workers succeeded, the job did not); node 0 reports its failure and node
    1's ranks are not waited for."""
    net = make_network(2)
    # Node 0 fails only once node 1's workers are gone (see failing_worker.py): a collective would
    # fail as soon as they close their connections, while they still run.
    (tmp_path / "finished").mkdir()
    agents = start_pair(net, start_agent, FAILING, "barrier",
                        env={"MN_EXIT_RANKS": "2,3", "MN_FAIL_AFTER_EXITS": str(tmp_path / "finished")})
    codes = wait_all(agents, 150, expect=None)
    assert codes == [1, 1], "\n".join(a.describe(80) for a in agents)
    finished = agents[1]
    assert finished.elapsed < 300, finished.describe(80)  # exit_barrier_timeout is 300 s
    assert "every worker of this node succeeded, but the job ended on another node" in finished.stderr, \
        finished.describe(80)
    assert re.search(r"launcher: the job failed on .*\(node 0, ", finished.stderr), finished.describe(80)
    assert re.search(r"^\s+[23]\s+\d+\s+\d+\s+succeeded\b", finished.stderr, re.M), finished.describe(80)
    assert "Root cause" in agents[0].stderr, agents[0].describe(80)
    states = re.findall(r"^\s+[01]\s+\d+\s+\d+\s+(failed|killed by the agent)\b", agents[0].stderr, re.M)
    assert states == ["failed", "killed by the agent"], agents[0].describe(80)  # rank 0 fails, rank 1 is stopped
    assert_no_cpp_trace(agents)
