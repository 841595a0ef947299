"""A DDP-over-NCCL job under launcher: heartbeats reach ``launcher status --json`` (steps/s shown), the
GPU columns, and ``/metrics``.

The heartbeats of such a job went missing (issue 38 §1, fixed by the heartbeat work): this is the
check on a real GPU that they arrive.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LAUNCHER, launcher_env
from tests.gpu import lane
from tests.status.jobs import status, wait_for

pytestmark = pytest.mark.gpu


def status_json(pid: int) -> dict[str, Any] | None:
    result = status(str(pid), "--json")
    return dict(json.loads(result.stdout)) if result.returncode == 0 else None


def status_record(log_dir: Path) -> dict[str, Any] | None:
    for path in log_dir.glob("*/status.json"):
        try:
            return dict(json.loads(path.read_text()))
        except ValueError:
            return None
    return None


@pytest.mark.timeout(150)
def test_ddp_over_nccl_beats_and_shows_its_gpu_in_status_and_metrics(tmp_path):
    stamps, go, logs = tmp_path / "stamps.jsonl", tmp_path / "go", tmp_path / "logs"
    started = time.time()
    # As the user ran it (python -m launcher ... &: the pid is the agent's).
    agent = subprocess.Popen([*LAUNCHER, "--standalone", "--nproc-per-node", "1", "--hang-timeout", "60",
                              "--log-dir", str(logs), "--metrics-port", "0", lane.JOB, "--mode", "ddp",
                              "--seconds", "100", "--go", str(go)],
                             env=launcher_env(lane.job_env(stamps)), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: lane.first(lane.stamps(stamps), "ready") or agent.poll() is not None, "the DDP job", 90)
        assert agent.poll() is None, agent.communicate()[1][-3000:]
        doc = None

        def beating() -> dict[str, Any] | None:
            nonlocal doc
            doc = status_json(agent.pid)
            ranks = doc["ranks"] if doc else []
            return doc if ranks and ranks[0]["heartbeat_age_s"] is not None and ranks[0]["steps_per_s"] else None

        try:
            wait_for(beating, "a heartbeat and a step rate in launcher status --json", 30)
        except AssertionError:
            raise AssertionError(f"no heartbeat from a DDP-over-NCCL job (issue 38 §1): {doc}") from None
        rank = doc["ranks"][0]
        lane.record_figure("ddp over nccl: launcher status steps/s", rank["steps_per_s"], unit="steps/s")
        assert rank["step"] and rank["step"] > 0, doc
        assert rank["gpu"] == 0 and rank["gpu_memory_bytes"] and rank["gpu_memory_bytes"] > 0, doc
        text = status(str(agent.pid))
        assert text.returncode == 0 and "GPU" in text.stdout, text.stdout + text.stderr
        record = wait_for(lambda: (r := status_record(logs)) and r.get("metrics_port") and r, "the metrics port")
        with urllib.request.urlopen(f"http://127.0.0.1:{record['metrics_port']}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        for name, least in (("launcher_rank_steps_per_second", 0.0), ("launcher_rank_gpu_memory_bytes", 0.0),
                            ("launcher_rank_heartbeat_age_seconds", -1.0)):
            lines = [line for line in metrics.splitlines() if line.startswith(name + "{")]
            assert lines and float(lines[0].rsplit(" ", 1)[1]) > least, (name, metrics[-3000:])
    finally:
        go.touch()
        try:
            _, stderr = agent.communicate(timeout=90)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    assert agent.returncode == 0, stderr[-3000:]
    done = lane.first(lane.stamps(stamps), "ddp")
    assert done and done["steps"] > 0, lane.stamps(stamps)
    print(f"ddp over nccl: {done['steps']} heartbeats in {done['seconds']:.1f} s "
          f"(since start {time.time() - started:.1f} s)", file=sys.stderr)
