"""Stopped means stopped (issue 41): SIGTERM or SIGINT ends the agent in every phase, and the other
node learns it from the rendezvous.

Two namespace hosts; node 0 serves the c10d store. The workers are standard-library processes
(``ending_worker.py`` with ``MN_GROUP=store``): torch proves nothing here. Each test signals one
agent once it said it reached the phase, then asserts its exit status, that it ended promptly
(bounds only catch the "waited out a 600 s timeout / close_timeout" kind of failure; the figures
are in benchmarks/bench_stopping.py), its one line naming the signal and the phase, and what the
other node did.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.multinode.harness import ENDING, SCRIPTS, AgentProcess, wait_until

pytestmark = [pytest.mark.netns]

RDZV_PORT = 29400
#: close_timeout far above BOUND: a stopped host that served the others' departure for it fails.
CONF = "join_timeout=600,read_timeout=5,keep_alive_interval=0.5,heartbeat_timeout=5,close_timeout=120"
#: Seconds within which a signalled agent, and the other node after it, must have ended.
BOUND = 20.0
STATUS = {signal.SIGTERM: 143, signal.SIGINT: 130}


def _args(net, index: int, *extra: str, nnodes: str = "2") -> list[str]:
    return [
        "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(RDZV_PORT), "--rdzv-id", "stop", "--rdzv-conf", CONF,
        "--local-addr", net[index].addr, "--monitor-interval", "0.2", *extra, ENDING,
    ]


def _start(net, start_agent, run: str = "*:600", *extra: str, nnodes: str = "2") -> list[AgentProcess]:
    env = {"MN_GROUP": "store", "MN_RUN": run}
    return [start_agent(net[i], _args(net, i, *extra, nnodes=nnodes), name=f"node{i}", env=env) for i in (0, 1)]


def _said(agent: AgentProcess, text: str, others: list[AgentProcess] = ()) -> None:
    wait_until(lambda: text in agent.stderr or text in agent.stdout or agent.poll() is not None, 90,
               f"{agent.name} to say {text!r}", on_timeout=lambda: "\n".join(a.describe() for a in [agent, *others]))
    assert text in agent.stderr or text in agent.stdout, "\n".join(a.describe() for a in [agent, *others])


def _stop(agent: AgentProcess, signum: int, others: list[AgentProcess] = ()) -> float:
    """Signal ``agent``, wait for it; its exit status is asserted, the seconds it took returned."""
    started = time.monotonic()
    agent.kill(signum)
    code = agent.wait(BOUND)
    assert code == STATUS[signum], "\n".join(a.describe() for a in [agent, *others])
    return time.monotonic() - started


def _ends(agent: AgentProcess, victim: AgentProcess, status: int = 1) -> None:
    """``agent`` (the other node) ends within BOUND with ``status``, naming the stopped node."""
    code = agent.wait(BOUND)
    assert code == status, agent.describe(80) + victim.describe()


def _line(agent: AgentProcess, signum: int, phase: str) -> None:
    name = signal.Signals(signum).name
    assert f"received {name} while {phase}; stopped" in agent.stderr, agent.describe(80)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_node_started_before_the_store_host_stops(make_network, start_agent, signum):
    """Waiting for a store nobody serves yet (the host starts later): the join timeout is not waited out."""
    net = make_network(2)
    agent = start_agent(net[1], _args(net, 1), name="node1", env={"MN_GROUP": "store"})
    _said(agent, f"waiting for the store at {net[0].endpoint(RDZV_PORT)} to accept connections")
    _stop(agent, signum)
    _line(agent, signum, f"connecting to the rendezvous store at {net[0].endpoint(RDZV_PORT)}")


@pytest.mark.parametrize(("victim", "signum"), [(0, signal.SIGTERM), (1, signal.SIGINT)], ids=["host", "non-host"])
def test_a_node_waiting_for_the_others_to_join_stops_and_they_end(make_network, start_agent, victim, signum):
    net = make_network(2)
    agents = _start(net, start_agent, nnodes="3")  # the third node never comes
    for agent in agents:
        _said(agent, "joined round 0 as number", agents)
    _stop(agents[victim], signum, agents)
    _line(agents[victim], signum, "waiting for the other nodes in the rendezvous")
    other = agents[1 - victim]
    _ends(other, agents[victim])
    node = re.search(r"node (\S+) joined round 0", agents[victim].stderr).group(1)
    assert f"the job has ended ({node}: stopped by {signal.Signals(signum).name})" in other.stderr, other.describe(80)


@pytest.mark.parametrize(("victim", "signum", "flags"), [
    (1, signal.SIGTERM, ()),
    (0, signal.SIGINT, ("--preload", "json")),
    (1, signal.SIGINT, ("--recovery", "in-place", "--preemption-signals", "SIGUSR1")),
], ids=["non-host-SIGTERM", "host-SIGINT-preload", "non-host-SIGINT-recovery-preemption-flags"])
def test_a_node_whose_workers_run_stops_and_the_other_ends_naming_it(make_network, start_agent, victim, signum,
                                                                    flags):
    net = make_network(2)
    agents = _start(net, start_agent, "*:600", *flags)
    _said(agents[0], "rank 0 ready", agents)
    _said(agents[1], "rank 1 ready", agents)
    _stop(agents[victim], signum, agents)
    other = agents[1 - victim]
    _ends(other, agents[victim])
    assert f"its agent received {signal.Signals(signum).name}" in other.stderr, other.describe(80)


@pytest.mark.parametrize(("victim", "signum"), [(0, signal.SIGTERM), (1, signal.SIGINT)], ids=["host", "non-host"])
def test_a_node_at_the_exit_barrier_stops_and_the_other_ends_naming_it(make_network, start_agent, victim, signum):
    """The issue's fourth phase: the host's workers done, the other node's still running."""
    net = make_network(2)
    agents = _start(net, start_agent, f"{victim}:0,*:600")
    _said(agents[victim], "waiting at the exit barrier", agents)
    _stop(agents[victim], signum, agents)
    _line(agents[victim], signum, "waiting for the other nodes to finish (every worker of this node had succeeded)")
    other = agents[1 - victim]
    _ends(other, agents[victim])
    assert f"its agent received {signal.Signals(signum).name}" in other.stderr, other.describe(80)


@pytest.mark.parametrize("second", [False, True], ids=["one-signal", "second-signal"])
def test_a_stopped_host_gives_a_stuck_node_seconds_and_a_second_signal_none(make_network, start_agent, second):
    """The other node cannot leave (its agent is stopped with SIGSTOP): the host serves the store
    for seconds, not close_timeout; a second SIGTERM ends it at once."""
    net = make_network(2)
    agents = _start(net, start_agent, "0:0,*:600")
    host, other = agents
    _said(host, "waiting at the exit barrier", agents)
    other.kill(signal.SIGSTOP)
    try:
        host.kill(signal.SIGTERM)
        if second:
            _said(host, "serving the store 2 s more for the other nodes to leave", agents)
            host.kill(signal.SIGTERM)
        assert host.wait(BOUND) == 143, host.describe(80)
        if second:
            assert "received SIGTERM again: exiting at once (143)" in host.stderr, host.describe(80)
        else:
            assert "had not left after 2 s (this node is stopped)" in host.stderr, host.describe(80)
    finally:
        other.kill(signal.SIGCONT)


def test_a_node_recovering_in_place_stops_its_kept_workers_in_the_rendezvous(make_network, start_agent,
                                                                            tmp_path: Path):
    """The host's rank 1 fails: it recovers in place, its live worker kept, and waits in the
    rendezvous for the other node (whose agent is stopped with SIGSTOP); a SIGTERM there gives
    the kept workers the signal, and ends the agent with the phase named."""
    net = make_network(2)
    fail = tmp_path / "fail"
    env = {"MN_FAIL_FILE": str(fail), "MN_FAIL_RANK": "1"}
    agents = [start_agent(net[i], [*_args(net, i, "--max-restarts", "1")[:-1], "--nproc-per-node", "2",
                                   str(SCRIPTS / "kept_worker.py")], name=f"node{i}", env=env) for i in (0, 1)]
    host, other = agents
    _said(host, "rank 0 ready (restart 0)", agents)
    _said(other, "rank 3 ready (restart 0)", agents)
    other.kill(signal.SIGSTOP)
    try:
        fail.write_text("1")
        _said(host, "joined round 1", agents)
        _stop(host, signal.SIGTERM, agents)
    finally:
        other.host.kill_all()  # frozen meanwhile: what it does next proves nothing here
    assert "received SIGTERM: forwarding it to 2 worker(s)" in host.stderr, host.describe(80)
    _line(host, signal.SIGTERM, "waiting for the other nodes in the rendezvous (the workers kept for an in-place "
          "recovery)")


def test_a_node_waiting_for_its_preload_template_stops(make_network, start_agent, tmp_path: Path):
    """The round formed, node 1's template still imports (``--preload``; node 0 has none, its
    workers run): the signal ends node 1's wait, and node 0 ends naming it."""
    net = make_network(2)
    mark = tmp_path / "importing"
    env = {"MN_GROUP": "store", "MN_IMPORT_MARK": str(mark), "MN_PG_TIMEOUT": "600"}
    agents = [start_agent(net[0], _args(net, 0), name="node0", env=env),
              start_agent(net[1], _args(net, 1, "--preload", "tests.multinode.scripts.slow_import"), name="node1",
                          env=env)]
    for agent in agents:
        _said(agent, "round 0 formed with 2 nodes", agents)
    wait_until(mark.exists, 60, "the template to import", on_timeout=lambda: "\n".join(a.describe() for a in agents))
    _stop(agents[1], signal.SIGINT, agents)
    _ends(agents[0], agents[1])
    assert "its agent received SIGINT" in agents[0].stderr, agents[0].describe(80)


def test_a_node_in_a_preemption_grace_stops_when_signalled(make_network, start_agent):
    """The notice came from the other node (SIGUSR1 there); a SIGTERM here ends the grace (600 s)."""
    net = make_network(2)
    agents = _start(net, start_agent, "*:600", "--preemption-signals", "SIGUSR1", "--preemption-grace", "600")
    _said(agents[0], "rank 0 ready", agents)
    _said(agents[1], "rank 1 ready", agents)
    agents[0].kill(signal.SIGUSR1)
    _said(agents[1], "preempted (SIGUSR1 received by", agents)
    agents[1].kill(signal.SIGTERM)
    assert agents[1].wait(BOUND) == 75, agents[1].describe(80)  # still a preemption: its status
    agents[0].kill(signal.SIGTERM)  # the host's own grace ends the same way
    assert agents[0].wait(BOUND) == 75, agents[0].describe(80)


def test_a_node_running_its_health_checks_stops(make_network, start_agent, tmp_path: Path):
    """The checks start beside the store's connect, and the join waits for them: the node waiting
    in the rendezvous for it learns that it was stopped. On a busy machine the check starts before
    the connect is done, and the stop can come before it: then the host cannot learn of it."""
    net = make_network(2)
    host = start_agent(net[0], _args(net, 0), name="node0", env={"MN_GROUP": "store"})
    _said(host, "serves the store")
    marker = tmp_path / "checking"
    check = tmp_path / "check.py"
    check.write_text(f"#!{sys.executable}\nimport pathlib, time\npathlib.Path({str(marker)!r}).write_text('1')\n"
                     "time.sleep(600)\n")
    check.chmod(0o755)
    agent = start_agent(net[1], _args(net, 1, "--health-checks", "command", "--health-check-cmd", str(check)),
                        name="node1", env={"MN_GROUP": "store"})
    wait_until(marker.exists, 60, "the health check to start", on_timeout=agent.describe)
    _stop(agent, signal.SIGTERM, [host])
    # The line names what the agent itself waited for: the checks, or the connect they run beside.
    connecting = re.escape(f"connecting to the rendezvous store at {net[0].endpoint(RDZV_PORT)}")
    assert re.search(rf"received SIGTERM while (running the health checks|{connecting}); stopped", agent.stderr), \
        agent.describe(80)
    if "while running the health checks" in agent.stderr:
        _ends(host, agent)  # it had its store connection: its stop closed the rendezvous for the host
    else:
        # Stopped before its connect was done (a busy machine): nothing could reach the host, which
        # waits for a second node until its join timeout, as it must. Stopped here instead.
        assert host.poll() is None, host.describe()
        _stop(host, signal.SIGTERM)
