"""``launcher status`` on either node of a 2-node namespaced job lists every rank of both nodes,
and a worker failure and restart show in the restart count and the round on both."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.multinode.harness import agent_env, c10d_unavailable, wait_all, wait_until
from tests.status.schema_check import errors, schema_from_doc

C10D_MISSING = c10d_unavailable()

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.xfail(
        C10D_MISSING is not None, reason=f"c10d backend not there yet: {C10D_MISSING}", run=False, strict=False
    ),
]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "status.md"
RDZV_PORT = 29400

# Every rank runs until the go file appears; in the first attempt, global rank 3 (node B's
# second) fails with exit status 3 once the fail file appears.
WORKER = """
import os, sys, time

go, fail = sys.argv[1], sys.argv[2]
first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
end = time.monotonic() + 90
while not os.path.exists(go) and time.monotonic() < end:
    if first and os.environ["RANK"] == "3" and os.path.exists(fail):
        sys.exit(3)
    print("step", flush=True)
    time.sleep(0.1)
"""


def status_on(host: Any, log_dir: Path) -> dict[str, Any] | None:
    """``launcher status LOG_DIR --json`` run inside ``host``; ``None`` until it answers."""
    result = host.run([sys.executable, "-m", "launcher", "status", str(log_dir), "--json"], env=agent_env(host),
                      timeout=60)
    if result.returncode != 0:
        return None
    return dict(json.loads(result.stdout))


def all_running(host: Any, log_dir: Path, restarts: int) -> dict[str, Any] | None:
    """The status on ``host`` once it shows all four ranks running after ``restarts`` restarts."""
    doc = status_on(host, log_dir)
    if (doc is None or doc["missing_nodes"] or doc["job"]["restarts_used"] != restarts
            or [(r["rank"], r["state"]) for r in doc["ranks"]] != [(rank, "running") for rank in range(4)]):
        return None
    return doc


@pytest.mark.timeout(180)
def test_status_on_either_node_lists_both_nodes_and_follows_a_restart(make_network, start_agent, tmp_path):
    net = make_network(2)
    worker, go, fail = tmp_path / "worker.py", tmp_path / "go", tmp_path / "fail"
    worker.write_text(WORKER)
    logs = [tmp_path / "logs-a", tmp_path / "logs-b"]
    args = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            net[0].endpoint(RDZV_PORT), "--rdzv-id", "mn-status", "--rdzv-conf", "join_timeout=60",
            "--monitor-interval", "0.2", "--max-restarts", "1"]
    agents = [start_agent(net[i], [*args, "--local-addr", net[i].addr, "--log-dir", str(logs[i]), str(worker),
                                   str(go), str(fail)]) for i in (0, 1)]
    schema = schema_from_doc(DOCS, "## `--json`")

    def detail() -> str:
        shown = [net[i].run([sys.executable, "-m", "launcher", "status", str(logs[i])], env=agent_env(net[i]),
                            timeout=60) for i in (0, 1)]
        return "\n".join([*(f"status on node {i}: {r.stdout}{r.stderr}" for i, r in enumerate(shown)),
                          *(a.describe(10) for a in agents)])
    before = []
    for i in (0, 1):
        doc = wait_until(lambda i=i: all_running(net[i], logs[i], 0), 60,
                         f"every rank in the status on node {i}", interval=0.5, on_timeout=detail)
        assert errors(doc, schema) == [], doc
        # Node A has group rank 0 with ranks 0-1, node B ranks 2-3; each node's own record is local.
        nodes = {n["group_rank"]: n for n in doc["nodes"]}
        assert sorted(nodes) == [0, 1] and nodes[i]["local"] and not nodes[1 - i]["local"], doc
        assert [nodes[n]["node"].split("_")[0] for n in (0, 1)] == [net[0].addr, net[1].addr], doc
        assert {r["rank"]: r["group_rank"] for r in doc["ranks"]} == {0: 0, 1: 0, 2: 1, 3: 1}, doc
        assert doc["job"]["world_size"] == 4 and doc["job"]["nodes"] == 2, doc
        before.append(doc)
    assert before[0]["ranks"] == [{**r, "cpu_percent": r0["cpu_percent"], "rss_bytes": r0["rss_bytes"],
                                   "heartbeat_age_s": r0["heartbeat_age_s"], "lines_per_s": r0["lines_per_s"]}
                                  for r, r0 in zip(before[1]["ranks"], before[0]["ranks"], strict=True)]
    fail.touch()
    for i in (0, 1):
        doc = wait_until(lambda i=i: all_running(net[i], logs[i], 1), 90,
                         f"the restart in the status on node {i}", interval=0.5, on_timeout=detail)
        assert doc["job"]["round"] > before[i]["job"]["round"] and doc["job"]["restarts_left"] == 0, doc
        # Node B used the restart; node A re-formed for it without using one of its own.
        assert [r["restarts"] for r in doc["ranks"]] == [0, 0, 1, 1], doc
        old = {r["pid"] for r in before[i]["ranks"]}
        assert not old & {r["pid"] for r in doc["ranks"]}, doc
    go.touch()
    wait_all(agents, 60)
    for i in (0, 1):
        result = net[i].run([sys.executable, "-m", "launcher", "status", str(logs[i])], env=agent_env(net[i]))
        assert result.returncode == 1 and "ended" in result.stderr, result
