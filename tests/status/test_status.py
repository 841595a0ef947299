"""``launcher status`` against real jobs on this machine: the rows, ``--json`` against the
documented schema, a restart, a job that ended, and bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from shlex import quote
from typing import Any

import pytest

from tests.conftest import LAUNCHER, launcher_env
from tests.status.jobs import WORKER, Job, status, wait_for
from tests.status.schema_check import errors, schema_from_doc

DOCS = Path(__file__).resolve().parents[2] / "docs" / "status.md"

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
    # With straggler detection, whose per-rank page carries heartbeat(step): the step rates.
    job = start_job(["--straggler-detection"])
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
    doc = status_json(str(job.process.pid), lambda d: all(r["lines_per_s"] and r["steps_per_s"] for r in d["ranks"]),
                      "line and step rates")
    assert errors(doc, schema_from_doc(DOCS, "## `--json`")) == [], doc
    assert doc["job"]["world_size"] == 2 and doc["job"]["nodes"] == 1, doc
    states = [(r["rank"], r["pid"], r["state"]) for r in doc["ranks"]]
    assert states == [(0, pids[0], "running"), (1, pids[1], "running")], doc
    for rank in doc["ranks"]:
        assert rank["rss_bytes"] > 1 << 20 and rank["cpu_percent"] is not None, doc
        assert rank["heartbeat_age_s"] is not None and rank["heartbeat_age_s"] < 60, doc
        assert rank["lines_per_s"] > 0, doc
        # WORKER beats once a step, every 0.05 s: well above 1 a second even on a loaded machine.
        assert rank["steps_per_s"] > 1 and rank["step"] > 1, doc
        assert rank["gpu"] is None and rank["gpu_util_percent"] is None, doc  # no NVML here: none made up
    assert doc["job"]["straggler_detection"] is True and doc["job"]["slow_ranks"] == [], doc
    text = status(job.log_dir).stdout
    assert text.splitlines()[1].split()[6:8] == ["HEARTBEAT", "STEPS/S"], text
    # Each row: ... HEARTBEAT ("0.1s ago") then STEPS/S, a rate once the agent has counted twice.
    rates = [line.split(" ago", 1)[1].split()[0] for line in text.splitlines()[2:]]
    assert len(rates) == 2 and all(rate == "-" or float(rate) > 0 for rate in rates), text
    assert doc["nodes"][0]["agent_pid"] == job.process.pid and doc["nodes"][0]["local"] is True, doc
    code, stderr = job.finish()
    assert code == 0, stderr


@pytest.mark.timeout(120)
def test_with_topology_each_node_shows_its_group_rank_and_path(start_job, tmp_path):
    """--topology: the node's path (from a site file naming this host) beside its group rank, in the
    table and in --json (the documented schema)."""
    import socket

    site = tmp_path / "site.txt"
    site.write_text(f"{socket.gethostname()} spine0.leaf12\n")
    job = start_job(["--topology", f"file:{site}"])
    job.pids()
    text = wait_for(lambda: (r := status(job.log_dir)).returncode == 0 and r.stdout, "a status")
    lines = text.splitlines()
    assert lines[1].split()[:5] == ["NODE", "GROUP", "PATH", "RANK", "LOCAL"], text
    assert [line.split()[1:4] for line in lines[2:]] == [["0", "spine0.leaf12", "0"], ["0", "spine0.leaf12", "1"]], text
    doc = json.loads(status(job.log_dir, "--json").stdout)
    assert errors(doc, schema_from_doc(DOCS, "## `--json`")) == [], doc
    assert [(n["group_rank"], n["topology"]) for n in doc["nodes"]] == [(0, "spine0.leaf12")], doc
    code, stderr = job.finish()
    assert code == 0, stderr


@pytest.mark.timeout(120)
def test_a_restart_changes_the_restart_count_and_the_pids(start_job):
    job = start_job(["--max-restarts", "2"], {"FAIL_FIRST": "1"})
    pids = job.pids(attempt=1)
    doc = status_json(job.log_dir, lambda d: d["job"]["restarts_used"] == 1, "the restart in the status")
    assert doc["job"]["restarts_left"] == 1 and doc["job"]["max_restarts"] == 2, doc
    assert doc["job"]["recoveries_in_place"] == 0, doc  # a worker that exits: a full restart
    assert {r["rank"]: (r["pid"], r["restarts"], r["state"]) for r in doc["ranks"]} == {
        0: (pids[0], 1, "running"), 1: (pids[1], 1, "running")}, doc
    assert errors(doc, schema_from_doc(DOCS, "## `--json`")) == [], doc
    code, stderr = job.finish()
    assert code == 0, stderr


# Rank 1 raises in its first attempt inside launcher.recoverable: the group recovers in place
# (rank 0's process is kept, rank 1's replaced), which uses a restart. Rank 1 raises once rank 0
# says it is inside its function (registered with launcher.recoverable: an event, not a delay; a
# rank not registered yet when its peer raises means a full restart).
IN_PLACE_WORKER = """
import os, sys, time
import launcher

inside, go = sys.argv[1] + ".inside", sys.argv[2]

def work():
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "0":
        open(inside, "w").close()
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
        while not os.path.exists(inside):
            time.sleep(0.01)
        raise ValueError("boom")
    end = time.monotonic() + 90
    while not os.path.exists(go) and time.monotonic() < end:
        launcher.heartbeat()
        time.sleep(0.05)

launcher.recoverable(work)()
"""


@pytest.mark.timeout(120)
def test_an_in_place_recovery_is_told_from_a_full_restart(write_script, tmp_path):
    job = Job(write_script("in_place.py", IN_PLACE_WORKER), tmp_path, ["--max-restarts", "2"], {})
    try:
        doc = status_json(job.log_dir, lambda d: d["job"]["restarts_used"] == 1 and all(
            r["state"] == "running" for r in d["ranks"]), "the recovery in the status")
        assert doc["job"]["recoveries_in_place"] == 1 and doc["job"]["restarts_left"] == 1, doc
        assert errors(doc, schema_from_doc(DOCS, "## `--json`")) == [], doc
        header = status(job.log_dir).stdout.splitlines()[0]
        assert "restarts 1 used (1 in place) / 1 left" in header, header
    finally:
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
        # Through the rendezvous: each refused before connecting anywhere.
        ("--rdzv-endpoint", "127.0.0.1:9"): (2, "--rdzv-id (or PET_RDZV_ID) is needed"),
        ("--rdzv-endpoint", "127.0.0.1:9", "--rdzv-id", "j", "--rdzv-backend", "static"):
            (2, "the static rendezvous backend cannot be read from outside the job"),
        ("--rdzv-endpoint", "127.0.0.1:9", "--rdzv-id", "j", "--rdzv-conf", "junk"): (2, "'junk' is not KEY=VALUE"),
        ("--rdzv-endpoint", "127.0.0.1:9", "--rdzv-id", "j", "--rdzv-conf", f"secret_file={tmp_path / 'none'}"):
            (2, "cannot read it"),
        ("--rdzv-endpoint", "127.0.0.1:9", "--rdzv-id", "j", str(tmp_path)): (2, "takes no PID or LOGDIR"),
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


@pytest.mark.timeout(120)
def test_a_job_whose_agent_was_killed_is_not_shown_as_running(start_job):
    job = start_job()
    job.pids()
    wait_for(lambda: status(job.log_dir).returncode == 0, "a status")
    job.process.kill()  # SIGKILL: the agent writes no last record; its watchdog ends the workers
    job.process.wait(timeout=30)
    for target in (job.log_dir, str(job.process.pid)):
        result = status(target)
        assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result
    result = status(job.log_dir)
    assert f"its agent (pid {job.process.pid}) is gone without saying how it ended" in result.stderr, result


@pytest.mark.timeout(180)
def test_the_pid_of_a_wrapper_shows_the_agent_below_it_or_names_several(write_script, tmp_path):
    # `timeout 600 launcher ... &` then `$!`, or srun: the pid a user holds is the wrapper's.
    script = write_script("worker.py", WORKER)
    go = tmp_path / "go"

    def agent_line(name: str) -> str:
        ready = tmp_path / name
        return " ".join(quote(a) for a in [*LAUNCHER, "--standalone", "--nproc-per-node", "1", "--log-dir",
                                           str(tmp_path / f"logs_{name}"), script, str(ready), str(go)])

    wrappers = {
        "one": subprocess.Popen(["timeout", "300", "sh", "-c", agent_line("one")], env=launcher_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        "two": subprocess.Popen(["sh", "-c", f"{agent_line('a')} & {agent_line('b')} & wait"], env=launcher_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    }
    try:
        for name in ("one", "a", "b"):
            wait_for(lambda n=name: Path(f"{tmp_path / n}.0.0").exists(), f"the rank of job {name}")
        worker = int(Path(f"{tmp_path / 'one'}.0.0").read_text())
        one = wrappers["one"].pid
        # Exactly one agent below: its status, and one line on stderr saying whose it is.
        result = wait_for(lambda: (r := status(str(one), "--json")).returncode == 0 and r, "the wrapped agent's status")
        doc = json.loads(result.stdout)
        agent = doc["nodes"][0]["agent_pid"]
        assert agent != one and [r["pid"] for r in doc["ranks"]] == [worker], doc
        assert result.stderr.splitlines() == [
            f"launcher: process {one} is not a launcher agent; showing the one below it, pid {agent}"], result
        assert str(worker) in status(str(one)).stdout
        # Several: bad input naming each of them, one line, exit 2.
        two = wrappers["two"].pid
        result = wait_for(lambda: (r := status(str(two))).returncode == 2 and r, "both agents publishing")
        assert len(result.stderr.splitlines()) == 1 and "2 agents run below it" in result.stderr, result
        agents = result.stderr.split("(pids ", 1)[1].split(")", 1)[0].split(", ")
        for pid in agents:
            assert status(pid).returncode == 0, pid
    finally:
        go.touch()
        for wrapper in wrappers.values():
            try:
                wrapper.wait(timeout=60)
            except subprocess.TimeoutExpired:
                wrapper.kill()
                wrapper.wait()


SILENT = """
import os, sys, time
import launcher

ready, go = sys.argv[1], sys.argv[2]
open(f"{ready}.{os.environ['RANK']}", "w").write(str(os.getpid()))
end = time.monotonic() + 90
while not os.path.exists(go) and time.monotonic() < end:
    if os.environ["RANK"] == "0":  # rank 1 was told to beat (--hang-timeout) and never does
        launcher.heartbeat()
    time.sleep(0.05)
"""


@pytest.mark.timeout(180)
def test_a_rank_that_never_beats_says_so_in_status_report_and_log(write_script, tmp_path):
    from tests.background_job import BackgroundJob

    ready = tmp_path / "ready"
    job = BackgroundJob(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "1", "--log-dir",
                         str(tmp_path / "logs"), write_script("silent.py", SILENT), str(ready), str(tmp_path / "go")],
                        tmp_path / "go")
    try:
        pids = job.wait_for_ranks([Path(f"{ready}.0"), Path(f"{ready}.1")], "the ranks")
        silent_pid = pids[Path(f"{ready}.1")]
        # --json: rank 0's heartbeat age, rank 1's wait for its first, past the timeout and not hung.
        doc = status_json(str(job.process.pid), lambda d: (d["ranks"][1]["no_heartbeat_yet_s"] or 0) > 1.5
                          and d["ranks"][0]["heartbeat_age_s"] is not None, "rank 1 waiting past the timeout")
        assert errors(doc, schema_from_doc(DOCS, "## `--json`")) == [], doc
        beating, silent = doc["ranks"]
        assert beating["no_heartbeat_yet_s"] is None and silent["heartbeat_age_s"] is None, doc
        assert silent["state"] == "running" and doc["job"]["hung_ranks"] == [], doc
        # The table says it in words.
        text = status(str(job.process.pid)).stdout
        rows = {line.split()[1]: line for line in text.splitlines()[2:]}
        assert re.search(r"no heartbeat yet after \d+s", rows["1"]) and " ago" in rows["0"], text
        # A report of every rank's stacks (SIGUSR2) names it the same way.
        job.process.send_signal(signal.SIGUSR2)
        wait_for(lambda: list((tmp_path / "logs").rglob("stacks_attempt_0_1.txt")), "the on-demand stacks file")
    finally:
        code, stderr = job.finish()
    assert code == 0, stderr
    assert re.search(rf"rank 1 on \S+ \(local rank 1, pid {silent_pid}\): no heartbeat yet after \d+ s", stderr), stderr
    # And the agent warned once that rank 1 is not watched, never about rank 0.
    warnings = [line for line in stderr.splitlines() if "no heartbeat yet after" in line and "not watched" in line]
    assert len(warnings) == 1 and f"rank 1 (local rank 1, pid {silent_pid})" in warnings[0], stderr
