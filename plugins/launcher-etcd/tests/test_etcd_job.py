"""A real job: two ``launcher`` agents on this host meet through etcd; gloo workers all_reduce."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import launcher.rendezvous.dynamic as dynamic
import pytest
from etcd_servers import EtcdCluster, free_ports, python_env

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

needs_core_algorithm = pytest.mark.skipif(
    not hasattr(dynamic, "handler_over_store"),
    reason="the core's rendezvous algorithm (launcher.rendezvous.dynamic.handler_over_store) is not in this tree",
)
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the workers need torch (gloo all_reduce)"
)

WORKER = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    print(f"RESULT rank={rank} world={world} sum={value.item():g} group={os.environ['GROUP_RANK']} "
          f"run={os.environ['TORCHELASTIC_RUN_ID']}", flush=True)
    dist.destroy_process_group()
    """
)


def agent(
    installed: Path, backend: str, endpoint: str, run_id: str, script: Path, *extra: str
) -> subprocess.Popen[str]:
    env = python_env({"PYTHONPATH": os.pathsep.join([str(installed), os.environ.get("PYTHONPATH", "")])})
    env.pop("OMP_NUM_THREADS", None)
    cmd = [
        sys.executable, "-m", "launcher",
        "--rdzv-backend", backend,
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", run_id,
        "--nnodes", "2",
        "--nproc-per-node", "1",
        "--local-addr", "127.0.0.1",
        "--rdzv-conf", "join_timeout=90,last_call_timeout=1,read_timeout=20",
        *extra,
        str(script),
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=script.parent)


@needs_core_algorithm
@needs_torch
def test_two_agents_run_a_gloo_job_through_etcd(
    shared_etcd: EtcdCluster, installed_plugin: Path, tmp_path: Path, run_id: str
) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(WORKER)
    # One agent says etcd, the other torchrun's etcd-v2: both names reach the same backend.
    agents = [
        agent(installed_plugin, "etcd", shared_etcd.endpoint, run_id, script),
        agent(installed_plugin, "etcd-v2", shared_etcd.endpoint, run_id, script),
    ]
    outputs = []
    try:
        for proc in agents:
            out, err = proc.communicate(timeout=120)
            outputs.append((proc.returncode, out, err))
    finally:
        for proc in agents:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for code, out, err in outputs:
        assert code == 0, f"agent failed ({code}):\n{out}\n{err[-3000:]}"
    results = sorted(line for _, out, _ in outputs for line in out.splitlines() if "RESULT" in line)
    assert len(results) == 2, outputs
    assert all("world=2 sum=3 " in line and f"run={run_id}" in line for line in results), results
    assert {line.split("group=")[1].split()[0] for line in results} == {"0", "1"}


def test_launcher_with_an_unreachable_etcd_fails_in_one_line(installed_plugin: Path, tmp_path: Path) -> None:
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('the workers must not start')\n")
    (port,) = free_ports(1)
    start = time.monotonic()
    proc = agent(installed_plugin, "etcd", f"127.0.0.1:{port}", "unreachable", script, "--rdzv-conf", "read_timeout=2")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert time.monotonic() - start < 30
    assert "Traceback" not in err and "the workers must not start" not in out + err
    assert "cannot reach etcd" in err and f"127.0.0.1:{port}" in err, err


def test_launcher_refuses_an_unknown_conf_key_naming_the_known_ones(installed_plugin: Path, tmp_path: Path) -> None:
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('the workers must not start')\n")
    proc = agent(installed_plugin, "etcd", "127.0.0.1:2379", "typo", script, "--rdzv-conf", "lease_tll=3")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err
    assert "lease_tll" in err and "lease_ttl" in err, err


FAILING_WORKER = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 1:
        time.sleep(1)
        sys.stderr.write("boom: rank 1 gives up\\n")
        sys.stderr.flush()
        os._exit(7)
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.1)
    """
)


@needs_core_algorithm
@needs_torch
def test_a_worker_failure_is_named_on_both_nodes(
    shared_etcd: EtcdCluster, installed_plugin: Path, tmp_path: Path, run_id: str
) -> None:
    """As with c10d: every node's report names the root cause (rank 1, exit code 7, its stderr)
    and lists its own ranks with their states."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING_WORKER)
    agents = [
        agent(installed_plugin, "etcd", shared_etcd.endpoint, run_id, script, "--monitor-interval", "0.2")
        for _ in range(2)
    ]
    outputs = []
    try:
        for proc in agents:
            out, err = proc.communicate(timeout=120)
            outputs.append((proc.returncode, out, err))
    finally:
        for proc in agents:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for code, out, err in outputs:
        assert code == 1, f"agent exited {code}:\n{out}\n{err[-3000:]}"
        root = err[err.find("Root cause"):]
        assert "Root cause" in err and "rank       : 1 (local rank 0" in root, err[-3000:]
        assert "exit code 7" in root and "boom: rank 1 gives up" in root, err[-3000:]
        assert "Ranks on this node" in err, err[-3000:]


# Runs until the file "go" appears beside it.
WAITING_WORKER = textwrap.dedent(
    """
    import os, time
    go = os.path.join(os.path.dirname(os.path.abspath(__file__)), "go")
    end = time.monotonic() + 90
    while not os.path.exists(go) and time.monotonic() < end:
        time.sleep(0.1)
    """
)


@needs_core_algorithm
def test_status_through_etcd_lists_both_nodes_without_joining(
    shared_etcd: EtcdCluster, installed_plugin: Path, tmp_path: Path, run_id: str
) -> None:
    """``launcher status --rdzv-backend etcd`` from a process that is no agent of the job reads every
    node's record from etcd; once the job ended, one line and exit status 1."""
    import json

    script, go = tmp_path / "waiting.py", tmp_path / "go"
    script.write_text(WAITING_WORKER)
    agents = [agent(installed_plugin, "etcd", shared_etcd.endpoint, run_id, script, "--monitor-interval", "0.2")
              for _ in range(2)]
    env = python_env({"PYTHONPATH": os.pathsep.join([str(installed_plugin), os.environ.get("PYTHONPATH", "")])})

    def status() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "launcher", "status", "--rdzv-backend", "etcd", "--rdzv-endpoint",
                               shared_etcd.endpoint, "--rdzv-id", run_id, "--json"], env=env, capture_output=True,
                              text=True, timeout=60)

    try:
        deadline, doc = time.monotonic() + 90, None
        while time.monotonic() < deadline:
            result = status()
            doc = json.loads(result.stdout) if result.returncode == 0 else None
            if doc and not doc["missing_nodes"] and len(doc["ranks"]) == 2:
                break
            assert all(a.poll() is None for a in agents), [a.communicate() for a in agents]
            time.sleep(0.5)
        assert doc is not None and len(doc["ranks"]) == 2, result
        assert [(r["rank"], r["group_rank"], r["state"]) for r in doc["ranks"]] == [(0, 0, "running"),
                                                                                   (1, 1, "running")], doc
        assert doc["job"]["nodes"] == 2 and doc["job"]["world_size"] == 2, doc
    finally:
        go.touch()
        outputs = [proc.communicate(timeout=120) for proc in agents]
    assert all(proc.returncode == 0 for proc in agents), outputs
    ended = status()
    assert ended.returncode == 1 and len(ended.stderr.splitlines()) == 1, ended
    assert "has ended" in ended.stderr and "Traceback" not in ended.stderr, ended
