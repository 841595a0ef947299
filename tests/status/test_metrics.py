"""``--metrics-port``: bad input refused before any worker, and a real Prometheus server scraping a
running job (Debian's ``prometheus`` package; skipped where the binary is missing)."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LAUNCHER, launcher_env
from tests.status.jobs import wait_for

MARKER_WORKER = "import sys; open(sys.argv[1], 'w').close()\n"


def test_bad_ports_are_one_line_and_no_worker_starts(write_script, tmp_path):
    script = write_script("marker.py", MARKER_WORKER)
    marker = tmp_path / "started"
    taken = socket.create_server(("", 0))  # held open for the test: a port in use
    port = taken.getsockname()[1]
    try:
        cases: list[tuple[list[str], dict[str, str], str]] = [
            (["--metrics-port", "http"], {}, "--metrics-port must be an integer from 0 to 65535, got 'http'"),
            (["--metrics-port", "65536"], {}, "--metrics-port must be an integer from 0 to 65535, got '65536'"),
            (["--metrics-port", "-1"], {}, "--metrics-port must be an integer from 0 to 65535"),
            ([], {"PET_METRICS_PORT": "x"}, "PET_METRICS_PORT must be an integer from 0 to 65535, got 'x'"),
            (["--metrics-port", str(port)], {}, f"--metrics-port {port} is in use"),
        ]
        for flags, env, words in cases:
            result = subprocess.run([*LAUNCHER, "--standalone", "--nproc-per-node", "2", *flags, script, str(marker)],
                                    env=launcher_env(env), capture_output=True, text=True, timeout=60)
            assert result.returncode == 2 and words in result.stderr, (flags, env, result)
            assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, (flags, result)
            assert not marker.exists(), (flags, env)
    finally:
        taken.close()


def _status_record(log_dir: Path) -> dict[str, Any] | None:
    for path in log_dir.glob("*/status.json"):
        try:
            return dict(json.loads(path.read_text()))
        except ValueError:  # pragma: no cover - replaced atomically, so never half a document
            return None
    return None


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def _query(base: str, expression: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expression})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
    except OSError:
        return []  # not up yet
    return list(answer["data"]["result"]) if answer.get("status") == "success" else []


@pytest.mark.timeout(180)
def test_a_real_prometheus_scrapes_the_ranks_and_the_restart_count(start_job, prometheus_binary, tmp_path):
    binary = prometheus_binary
    job = start_job(["--max-restarts", "1", "--metrics-port", "0"], {"FAIL_FIRST": "1"})
    job.pids(attempt=1)
    record = wait_for(lambda: (r := _status_record(job.log_dir)) and r.get("metrics_port") and r, "the metrics port")
    config = tmp_path / "prometheus.yml"
    # honor_labels: the job's own `job` label stands (else Prometheus renames it exported_job).
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: launcher\n"
        "    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{record['metrics_port']}']}}]\n"
    )
    listen = f"127.0.0.1:{_free_port()}"
    server = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address={listen}"], stdout=subprocess.DEVNULL,
                              stderr=(tmp_path / "prometheus.log").open("wb"))
    try:
        base = f"http://{listen}"
        run_id = record["run_id"]

        def ranks_up() -> dict[str, str] | None:
            rows = _query(base, f'launcher_rank_up{{job="{run_id}"}}')
            found = {r["metric"].get("rank"): r["value"][1] for r in rows}
            return found if found == {"0": "1", "1": "1"} else None

        wait_for(ranks_up, f"Prometheus to scrape both ranks\n{(tmp_path / 'prometheus.log').read_text()[-2000:]}",
                 timeout=90)
        restarts = _query(base, f'launcher_restarts_total{{job="{run_id}"}}')
        assert [(r["metric"]["node"], r["value"][1]) for r in restarts] == [(record["node"], "1")], restarts
        left = _query(base, f'launcher_restarts_left{{job="{run_id}"}}')
        assert [r["value"][1] for r in left] == ["0"], left
    finally:
        server.terminate()
        server.wait(timeout=30)
    code, stderr = job.finish()
    assert code == 0, stderr
    assert "metrics on http://" in stderr and f":{record['metrics_port']}/metrics" in stderr, stderr
