"""launcher inside Kubeflow PyTorchJob pods: configured only by the variables the training operator sets.

For a PyTorchJob without an elastic policy, the operator (kubeflow/training-operator, v1.7 and later)
gives every container of replica ``<type>-<index>``:

- ``PYTHONUNBUFFERED=0``;
- ``MASTER_ADDR`` and ``PET_MASTER_ADDR``: the Master replica's service, ``<job>-master-0``;
- ``MASTER_PORT`` and ``PET_MASTER_PORT``: the Master container's port named ``pytorchjob-port``;
- ``WORLD_SIZE``: replicas x ``nprocPerNode``; ``RANK`` and ``PET_NODE_RANK``: the replica's index
  (Master 0, Worker i is i + 1);
- ``PET_NPROC_PER_NODE``: ``spec.nprocPerNode``; ``PET_NNODES``: the number of replicas.

With ``elasticPolicy.standalone: true`` it also writes ``PET_STANDALONE`` with an empty value, which
crashes torchrun (``invalid literal for int()``); launcher reads it as "off". The pods below get
exactly these variables and run the container command ``launcher ar.py``; ``<job>-master-0``
becomes ``localhost`` (the master's own service, in a pod).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from torchx_plugin_support import ALLREDUCE_SCRIPT, clean_env, free_port, results

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def pod_env(*, replicas: int, index: int, nproc: int, port: int) -> dict[str, str]:
    """The operator's variables for replica ``index`` (0 is the Master) of a job with ``replicas`` pods."""
    return {
        "PYTHONUNBUFFERED": "0",
        "MASTER_ADDR": "localhost",
        "PET_MASTER_ADDR": "localhost",
        "MASTER_PORT": str(port),
        "PET_MASTER_PORT": str(port),
        "WORLD_SIZE": str(replicas * nproc),
        "RANK": str(index),
        "PET_NODE_RANK": str(index),
        "PET_NPROC_PER_NODE": str(nproc),
        "PET_NNODES": str(replicas),
        "PET_STANDALONE": "",
    }


def start_pod(script_dir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "launcher", "ar.py"],
        cwd=script_dir,
        env=clean_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_single_pod_job(tmp_path: Path) -> None:
    (tmp_path / "ar.py").write_text(ALLREDUCE_SCRIPT)
    port = free_port()
    pod = start_pod(tmp_path, pod_env(replicas=1, index=0, nproc=2, port=port))
    output, _ = pod.communicate(timeout=90)
    assert pod.returncode == 0, output
    found = sorted(results(output), key=lambda r: r["rank"])
    # Each worker has its own RANK (not the pod's RANK=0) and the job's WORLD_SIZE; the gloo all_reduce worked.
    assert [(r["rank"], r["env_rank"], r["world"], r["sum"]) for r in found] == [(0, 0, 2, 3.0), (1, 1, 2, 3.0)]
    # Static rendezvous at PET_MASTER_ADDR:PET_MASTER_PORT (so PET_STANDALONE="" did not mean standalone).
    assert {r["master_port"] for r in found} == {port}
    assert {r["master_addr"] for r in found} <= {"localhost", "127.0.0.1"}
    assert {r["run_id"] for r in found} == {"none"}


def test_master_and_worker_pods(tmp_path: Path) -> None:
    (tmp_path / "ar.py").write_text(ALLREDUCE_SCRIPT)
    port = free_port()
    pods = [start_pod(tmp_path, pod_env(replicas=2, index=index, nproc=2, port=port)) for index in (0, 1)]
    try:
        outputs = [pod.communicate(timeout=90)[0] for pod in pods]
    finally:
        for pod in pods:
            if pod.poll() is None:
                pod.kill()
                pod.wait()
    assert [pod.returncode for pod in pods] == [0, 0], "\n---\n".join(outputs)
    by_pod = [sorted(r["rank"] for r in results(output)) for output in outputs]
    assert by_pod == [[0, 1], [2, 3]]  # node rank = PET_NODE_RANK
    assert all(r["world"] == 4 and r["sum"] == 10.0 for output in outputs for r in results(output))
