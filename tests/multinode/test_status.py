"""``launcher status`` on either node of a 2-node namespaced job lists every rank of both nodes,
and a worker failure and restart show in the restart count and the round on both; from a third
host, not a node of the job, through the job's rendezvous with its secret, it lists them too,
and a wrong secret is one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.multinode.harness import agent_env, wait_all, wait_until
from tests.status.schema_check import errors, schema_from_doc

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "status.md"
RDZV_PORT = 29400
SECRET = "7d1c5e0a9b3f42e8a6c4d2b0f1e3a5c7-status-secret"

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


def status_through_rendezvous(host: Any, flags: list[str], env: dict[str, str] | None = None) -> Any:
    """``launcher status --json`` run inside ``host`` with ``flags`` (the job's rendezvous)."""
    return host.run([sys.executable, "-m", "launcher", "status", *flags, "--json"],
                    env={**agent_env(host), **(env or {})}, timeout=60)


def all_running(host: Any, log_dir: Path, restarts: int) -> dict[str, Any] | None:
    """The status on ``host`` once it shows all four ranks running after ``restarts`` restarts."""
    doc = status_on(host, log_dir)
    if (doc is None or doc["missing_nodes"] or doc["job"]["restarts_used"] != restarts
            or [(r["rank"], r["state"]) for r in doc["ranks"]] != [(rank, "running") for rank in range(4)]):
        return None
    return doc


@pytest.mark.timeout(180)
def test_status_on_either_node_lists_both_nodes_and_follows_a_restart(make_network, start_agent, tmp_path):
    net = make_network(3)  # two nodes of the job, and a host that is not one of them
    worker, go, fail = tmp_path / "worker.py", tmp_path / "go", tmp_path / "fail"
    worker.write_text(WORKER)
    secret = tmp_path / "rdzv.secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    logs = [tmp_path / "logs-a", tmp_path / "logs-b"]
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", net[0].endpoint(RDZV_PORT), "--rdzv-id", "mn-status"]
    args = ["--nnodes", "2", "--nproc-per-node", "2", *rendezvous,
            "--rdzv-conf", f"join_timeout=60,secret_file={secret}",
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
    # From the third host, through the rendezvous (its store admits, once the round is closed,
    # only the job's nodes and those that prove the secret): every rank of both nodes.
    def remote() -> dict[str, Any] | None:
        result = status_through_rendezvous(net[2], [*rendezvous, "--rdzv-conf", f"secret_file={secret}"])
        doc = json.loads(result.stdout) if result.returncode == 0 else None
        return doc if doc and not doc["missing_nodes"] and len(doc["ranks"]) == 4 else None

    doc = wait_until(remote, 60, "every rank in the status through the rendezvous", interval=0.5, on_timeout=detail)
    assert errors(doc, schema) == [], doc
    assert [(r["rank"], r["group_rank"], r["state"]) for r in doc["ranks"]] == [
        (0, 0, "running"), (1, 0, "running"), (2, 1, "running"), (3, 1, "running")], doc
    assert {r["pid"] for r in doc["ranks"]} == {r["pid"] for r in before[0]["ranks"]}, doc
    assert not any(n["local"] for n in doc["nodes"]) and doc["job"]["world_size"] == 4, doc
    # The same through the job's PET_ variables and the secret in the environment, as a table.
    table = net[2].run([sys.executable, "-m", "launcher", "status"], timeout=60, env={
        **agent_env(net[2]), "PET_RDZV_ENDPOINT": net[0].endpoint(RDZV_PORT), "PET_RDZV_ID": "mn-status",
        "LAUNCHER_RDZV_SECRET": SECRET})
    assert table.returncode == 0 and len(table.stdout.splitlines()) == 6, table
    # A wrong secret, or none: one line, exit status 1, nothing read.
    wrong = status_through_rendezvous(net[2], rendezvous, {"LAUNCHER_RDZV_SECRET": "not-the-job-secret-at-all"})
    assert wrong.returncode == 1 and wrong.stdout == "" and len(wrong.stderr.splitlines()) == 1, wrong
    assert "refuses this client" in wrong.stderr and "secret" in wrong.stderr, wrong
    other = status_through_rendezvous(net[2], [*rendezvous[:-1], "no-such-job", "--rdzv-conf", f"secret_file={secret}"])
    assert other.returncode == 1 and len(other.stderr.splitlines()) == 1, other
    assert "no job 'no-such-job' at this rendezvous" in other.stderr, other
    none = status_through_rendezvous(net[2], rendezvous)
    assert none.returncode == 1 and len(none.stderr.splitlines()) == 1, none
    assert "does not admit this host" in none.stderr, none
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
    # Through the rendezvous too: the new round's records (read from its agent keys), new pids.
    after = wait_until(lambda: (d := remote()) and d["job"]["round"] == doc["job"]["round"] and d, 60,
                       "the new round through the rendezvous", interval=0.5, on_timeout=detail)
    assert after["job"]["restarts_used"] == 1 and [r["restarts"] for r in after["ranks"]] == [0, 0, 1, 1], after
    assert {r["pid"] for r in after["ranks"]} == {r["pid"] for r in doc["ranks"]}, after
    # The reader never joined: both nodes still form the job, which restarted once and no more.
    go.touch()
    wait_all(agents, 60)
    for i in (0, 1):
        result = net[i].run([sys.executable, "-m", "launcher", "status", str(logs[i])], env=agent_env(net[i]))
        assert result.returncode == 1 and "ended" in result.stderr, result
    # The job is gone, and its rendezvous store with it: one line, exit status 1.
    gone = status_through_rendezvous(net[2], [*rendezvous, "--rdzv-conf", f"secret_file={secret}"])
    assert gone.returncode == 1 and len(gone.stderr.splitlines()) == 1 and "Traceback" not in gone.stderr, gone
