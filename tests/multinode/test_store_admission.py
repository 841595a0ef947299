"""Only the job may use its stores: real c10d agents in namespace hosts, and hosts that are not
members trying to read, write or join (see docs/store-security.md).

Node 0 serves the rendezvous store (the endpoint is its address); group rank 0's agent serves
the workers' store. Every job runs ``scripts/gated_worker.py``, which waits (its round closed,
its workers connected) until the test lets it finish, so nothing here depends on timing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.multinode.harness import ROOT, SCRIPTS, wait_all, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.slow]

RDZV_PORT = 29400
GATED = str(SCRIPTS / "gated_worker.py")
CONF = "join_timeout=30,last_call_timeout=1,read_timeout=5,keep_alive_interval=0.5,heartbeat_timeout=3,close_timeout=15"
SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f0-site-secret"

# Run on a host that is not a member: use each store it is given with launcher's client
# (whose refusals are what any client gets: the server closes the connection at accept).
ATTACK = """
import json, sys
from launcher.store.client import TCPStoreClient
targets, run_id = json.loads(sys.argv[1]), sys.argv[2]
for name, host, port in targets:
    try:
        client = TCPStoreClient(host, port, timeout=3, connect_timeout=2)
    except Exception as exc:
        print(name, "refused:", type(exc).__name__, flush=True)
        continue
    used = []
    closing = f"launcher/rdzv/{run_id}/closed"
    for what, call in (("read", client.list_keys), ("write", lambda: client.set(closing, b"x"))):
        try:
            call()
            used.append(what)
        except Exception:
            pass
    print(name, "used:", ",".join(used) or "nothing", flush=True)
"""


def args(net, index: int, state: Path, run_id: str, *, nnodes: str = "2", conf: str = CONF) -> list[str]:
    return [
        "--nnodes", nnodes,
        "--nproc-per-node", "1",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(RDZV_PORT),
        "--rdzv-id", run_id,
        "--rdzv-conf", conf,
        "--local-addr", net[index].addr,
        "--monitor-interval", "0.2",
        "--shutdown-timeout", "3",
        "--max-restarts", "0",
        GATED, str(state),
    ]


def logs(agents) -> str:
    return "\n".join(agent.describe(60) for agent in agents)


def wait_ready(state: Path, world: int, agents) -> dict:
    """The workers' store of the group of ``world`` ranks, once it has formed."""

    def ready():
        exited = [a for a in agents if a.poll() is not None]
        if exited:
            raise AssertionError(f"agent {exited[0].name} exited early\n{logs(agents)}")
        path = state / f"ready-{world}"
        return json.loads(path.read_text()) if path.exists() else None

    return wait_until(ready, 90, f"a group of {world} ranks", on_timeout=lambda: logs(agents))


def attack(host, targets: list[tuple[str, str, int]], run_id: str) -> dict[str, str]:
    result = host.run([sys.executable, "-c", ATTACK, json.dumps(targets), run_id], timeout=60, cwd=ROOT)
    lines = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines() if " " in line)
    assert set(lines) == {name for name, _, _ in targets}, result.stdout + result.stderr
    return lines


def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "rdzv.secret"
    path.write_text(SECRET + "\n")
    os.chmod(path, 0o600)
    return path


@pytest.mark.timeout(180)
def test_foreign_host_can_neither_read_nor_write_a_running_jobs_stores(make_network, start_agent, tmp_path):
    """Nothing configured: once the round is closed, a third host can use neither the rendezvous
    store nor the workers' store (it cannot end the job), and the job finishes normally."""
    net = make_network(3)
    state = tmp_path / "state"
    state.mkdir()
    agents = [start_agent(net[i], args(net, i, state, "gated"), name=f"node{i}") for i in (0, 1)]
    workers = wait_ready(state, 2, agents)
    seen = attack(net[2], [("rendezvous", net[0].addr, RDZV_PORT), ("workers", workers["addr"], workers["port"])],
                  "gated")
    assert seen["rendezvous"].startswith("refused"), seen
    assert seen["workers"].startswith("refused"), seen
    (state / "go").touch()
    wait_all(agents, 60)
    assert "all_reduce ok 3" in agents[0].stdout + agents[1].stdout, logs(agents)
    # The store's host says whom it turned away (once).
    assert f"refused {net[2].addr}" in agents[0].stderr, agents[0].describe(80)


@pytest.mark.timeout(240)
def test_joining_a_running_job_needs_the_ranges_and_the_secret(make_network, start_agent, tmp_path):
    """join_networks and a secret: an agent outside the ranges, or with the wrong secret, cannot
    join a running 2:3 job (nor can a client without the secret use its store); one in the
    ranges with the secret joins it, and the three nodes finish the job."""
    net = make_network(4)  # h0-h2 are in 10.213.0.0/30; h3 (10.213.0.4) is not
    state = tmp_path / "state"
    state.mkdir()
    secret = secret_file(tmp_path)
    conf = f"{CONF},join_networks=10.213.0.0/30,secret_file={secret}"
    members = [start_agent(net[i], args(net, i, state, "joins", nnodes="2:3", conf=conf), name=f"node{i}")
               for i in (0, 1)]
    wait_ready(state, 2, members)

    outside = start_agent(net[3], args(net, 3, state, "joins", nnodes="2:3",
                                       conf=conf.replace("join_timeout=30", "join_timeout=4")), name="outside")
    wrong_file = tmp_path / "wrong.secret"
    wrong_file.write_text("a-different-secret-of-enough-length\n")
    os.chmod(wrong_file, 0o600)
    wrong = start_agent(net[2], args(net, 2, state, "joins", nnodes="2:3",
                                     conf=conf.replace(str(secret), str(wrong_file))), name="wrong")
    assert wrong.wait(60) != 0, wrong.describe()
    assert "does not know our secret" in wrong.stderr, wrong.describe()
    assert outside.wait(60) != 0, outside.describe()
    assert "does not admit this host" in outside.stderr, outside.describe()
    seen = attack(net[2], [("rendezvous", net[0].addr, RDZV_PORT)], "joins")
    assert seen["rendezvous"].startswith("refused"), seen
    assert not (state / "ready-3").exists()

    joiner = start_agent(net[2], args(net, 2, state, "joins", nnodes="2:3", conf=conf), name="joiner")
    agents = [*members, joiner]
    wait_ready(state, 3, agents)
    (state / "go").touch()
    wait_all(agents, 60)
    assert "rank 0 of 3 all_reduce ok 6" in "".join(a.stdout for a in agents), logs(agents)
