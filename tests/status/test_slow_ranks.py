"""A real DDP job whose rank 1 is slow: ``launcher status`` names it in its header and ``--json``,
and ``/metrics`` flags it, while straggler detection names it."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import LAUNCHER, launcher_env
from tests.status.jobs import status

pytest.importorskip("torch")

#: The stragglers tests' workload (read-only here): gloo DDP whose rank can be made slow.
DDP_JOB = str(Path(__file__).resolve().parents[1] / "stragglers" / "scripts" / "ddp_job.py")


@pytest.mark.timeout(150)
def test_a_slow_rank_is_named_in_the_status_and_its_metric(tmp_path):
    logs = tmp_path / "logs"
    # Rank 1's compute takes 1.6x the others' for the whole run (it stops by itself after 40 s).
    job = subprocess.Popen([*LAUNCHER, "--standalone", "--nproc-per-node", "3", "--straggler-detection",
                            "--straggler-interval", "1", "--log-dir", str(logs), "--metrics-port", "0", DDP_JOB,
                            "--seconds", "40", "--compute", "0.05", "--slow-rank", "1", "--factor", "1.6",
                            "--heartbeat"], env=launcher_env({"TMPDIR": str(tmp_path)}), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    try:
        doc = None
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline and job.poll() is None:
            result = status(logs, "--json")
            doc = json.loads(result.stdout) if result.returncode == 0 else None
            if doc and doc["job"]["slow_ranks"]:
                break
            time.sleep(0.5)
        assert doc is not None and doc["job"]["slow_ranks"] == [1], (doc, job.poll())
        assert doc["job"]["straggler_detection"] is True, doc
        # heartbeat(step) every step: each rank's step rate, the slow one's included.
        assert all(r["steps_per_s"] is None or r["steps_per_s"] > 0 for r in doc["ranks"]), doc
        header = status(logs).stdout.splitlines()
        assert "slow ranks (stragglers): 1" in header, header
        record = json.loads(next(logs.glob("*/status.json")).read_text())
        with urllib.request.urlopen(f"http://127.0.0.1:{record['metrics_port']}/metrics", timeout=10) as response:
            metrics = response.read().decode().splitlines()
        slow = {line.split('rank="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
                for line in metrics if line.startswith("launcher_rank_slow{")}
        assert slow == {"0": "0", "1": "1", "2": "0"}, metrics
        assert any(line.startswith("launcher_stragglers{") and line.endswith(" 1") for line in metrics), metrics
    finally:
        if job.poll() is None:
            job.terminate()
        _, stderr = job.communicate(timeout=60)
    assert "straggler: rank 1 " in stderr, stderr[-3000:]
