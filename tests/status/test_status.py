"""``launcher status`` against real jobs on this machine: the rows, ``--json`` against the
documented schema, a restart, a job that ended, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LAUNCHER, launcher_env
from tests.status.schema_check import errors, schema_from_doc

DOCS = Path(__file__).resolve().parents[2] / "docs" / "status.md"

# Each rank notes its pid, then prints and heartbeats until the go file appears. With FAIL_FIRST
# set, the first attempt's rank 1 fails at once instead (the group then restarts).
WORKER = """
import os, sys, time
import launcher

ready, go = sys.argv[1], sys.argv[2]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if os.environ.get("FAIL_FIRST") and attempt == 0 and os.environ["RANK"] == "1":
    sys.exit(3)
with open(f"{ready}.{attempt}.{os.environ['RANK']}", "w") as handle:
    handle.write(str(os.getpid()))
end = time.monotonic() + 90
while not os.path.exists(go) and time.monotonic() < end:
    launcher.heartbeat()
    print("step", flush=True)
    time.sleep(0.05)
"""


def status(target: str | Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAUNCHER, "status", str(target), *flags], env=launcher_env(), capture_output=True,
                          text=True, timeout=60)


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Job:
    """A two-rank job of WORKER with ``--log-dir``, in the background."""

    def __init__(self, script: str, tmp_path: Path, flags: list[str], env: dict[str, str]) -> None:
        self.ready, self.go, self.log_dir = tmp_path / "ready", tmp_path / "go", tmp_path / "logs"
        self.process = subprocess.Popen(
            [*LAUNCHER, "--standalone", "--nproc-per-node", "2", "--log-dir", str(self.log_dir),
             "--hang-timeout", "120", *flags, script, str(self.ready), str(self.go)],
            env=launcher_env(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )

    def pids(self, attempt: int = 0) -> dict[int, int]:
        """Each rank's pid once every rank of ``attempt`` is up."""
        files = [Path(f"{self.ready}.{attempt}.{rank}") for rank in (0, 1)]
        wait_for(lambda: all(f.exists() and f.read_text() for f in files) or self.process.poll() is not None,
                 f"the ranks of attempt {attempt}")
        assert self.process.poll() is None, self.finish()
        return {rank: int(f.read_text()) for rank, f in enumerate(files)}

    def finish(self) -> tuple[int, str]:
        self.go.touch()
        try:
            _, stderr = self.process.communicate(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        return self.process.returncode, stderr


@pytest.fixture
def start_job(write_script: Callable[[str, str], str], tmp_path: Path) -> Iterator[Callable[..., Job]]:
    jobs: list[Job] = []

    def start(flags: list[str] | None = None, env: dict[str, str] | None = None) -> Job:
        jobs.append(Job(write_script("worker.py", WORKER), tmp_path, flags or [], env or {}))
        return jobs[-1]

    yield start
    for job in jobs:
        if job.process.returncode is None:
            job.finish()


def status_json(target: str | Path, until: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The first ``--json`` document of ``target`` for which ``until`` holds."""
    def attempt() -> dict[str, Any] | None:
        result = status(target, "--json")
        if result.returncode != 0:
            return None
        doc = dict(json.loads(result.stdout))
        return doc if until(doc) else None

    return dict(wait_for(attempt, what))


@pytest.mark.timeout(120)
def test_a_running_job_shows_each_rank_by_log_dir_and_by_pid(start_job):
    job = start_job()
    pids = job.pids()
    # By the log directory: the header and one row per rank, with its pid and state.
    text = wait_for(lambda: (r := status(job.log_dir)).returncode == 0 and r.stdout, "a status")
    lines = text.splitlines()
    assert "world size 2" in lines[0] and "restarts 0 used / 0 left" in lines[0], text
    assert lines[1].split()[:5] == ["NODE", "RANK", "LOCAL", "PID", "STATE"], text
    rows = {int(line.split()[1]): line.split() for line in lines[2:]}
    assert sorted(rows) == [0, 1], text
    for rank, pid in pids.items():
        assert rows[rank][3:5] == [str(pid), "running"], text
    # By the agent's pid, as JSON: the documented schema, and the live figures filled in once the
    # agent published twice (the line rate needs two counts).
    doc = status_json(str(job.process.pid), lambda d: all(r["lines_per_s"] for r in d["ranks"]), "line rates")
    assert errors(doc, schema_from_doc(DOCS, "## `--json`")) == [], doc
    assert doc["job"]["world_size"] == 2 and doc["job"]["nodes"] == 1, doc
    states = [(r["rank"], r["pid"], r["state"]) for r in doc["ranks"]]
    assert states == [(0, pids[0], "running"), (1, pids[1], "running")], doc
    for rank in doc["ranks"]:
        assert rank["rss_bytes"] > 1 << 20 and rank["cpu_percent"] is not None, doc
        assert rank["heartbeat_age_s"] is not None and rank["heartbeat_age_s"] < 60, doc
        assert rank["lines_per_s"] > 0, doc
    assert doc["nodes"][0]["agent_pid"] == job.process.pid and doc["nodes"][0]["local"] is True, doc
    code, stderr = job.finish()
    assert code == 0, stderr


@pytest.mark.timeout(120)
def test_a_restart_changes_the_restart_count_and_the_pids(start_job):
    job = start_job(["--max-restarts", "2"], {"FAIL_FIRST": "1"})
    pids = job.pids(attempt=1)
    doc = status_json(job.log_dir, lambda d: d["job"]["restarts_used"] == 1, "the restart in the status")
    assert doc["job"]["restarts_left"] == 1 and doc["job"]["max_restarts"] == 2, doc
    assert {r["rank"]: (r["pid"], r["restarts"], r["state"]) for r in doc["ranks"]} == {
        0: (pids[0], 1, "running"), 1: (pids[1], 1, "running")}, doc
    assert errors(doc, schema_from_doc(DOCS, "## `--json`")) == [], doc
    code, stderr = job.finish()
    assert code == 0, stderr


@pytest.mark.timeout(120)
def test_a_job_that_ended_is_one_line_and_exit_1(start_job):
    job = start_job()
    job.pids()
    wait_for(lambda: status(job.log_dir).returncode == 0, "a status")
    watch = subprocess.Popen([*LAUNCHER, "status", str(job.log_dir), "--watch", "--interval", "0.5"],
                             env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        code, stderr = job.finish()
        assert code == 0, stderr
        out, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    # --watch printed views while the job ran, then the end, and stopped by itself.
    assert watch.returncode == 0 and out.count("NODE  RANK") >= 1, (out, err)
    assert out.rstrip().splitlines()[-1].startswith("launcher: job "), out
    assert "ended" in out.rstrip().splitlines()[-1], out
    for target in (job.log_dir, str(job.process.pid)):
        result = status(target)
        assert result.returncode == 1 and result.stdout == "", result
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result
    assert "ended" in status(job.log_dir).stderr and "exit status 0" in status(job.log_dir).stderr


def test_bad_targets_and_flags_are_one_line_each(tmp_path):
    (tmp_path / "empty").mkdir()
    cases = {
        (str(tmp_path / "empty"),): (2, "is not a launcher job's log directory"),
        (str(tmp_path / "missing"),): (2, "is neither a pid nor a directory"),
        (str(tmp_path), "--bogus"): (2, "unknown argument '--bogus'"),
        (str(tmp_path), "--interval", "soon"): (2, "--interval"),
        (): (2, "usage: launcher status"),
    }
    for args, (code, words) in cases.items():
        result = subprocess.run([*LAUNCHER, "status", *args], env=launcher_env(), capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == code and words in result.stderr, (args, result)
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, (args, result)
    # A pid that runs no launcher agent: this test's own process.
    result = status(str(os.getpid()))
    assert result.returncode == 1 and "is not a launcher agent" in result.stderr, result
    assert len(result.stderr.splitlines()) == 1, result
