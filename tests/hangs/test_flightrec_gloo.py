"""Real gloo workers hung in a collective: the flight recorder names the rank that did not enter
it, in the hang report, the failure report's root cause, ``launcher bundle`` and ``launcher status``."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import tarfile
import time

import pytest

from tests.conftest import LAUNCHER, launcher_env, run_launcher

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (gloo)")

# Rank 1 sleeps after five all_reduces while rank 0 waits in the sixth. With RELEASE (a path), a
# restarted attempt beats until that file exists, then both finish.
SIXTH = """
import datetime, os, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
import launcher

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
value = torch.ones(4)
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    release = Path(sys.argv[1])
    while not release.exists():
        launcher.heartbeat()
        time.sleep(0.1)
    dist.barrier()
    sys.exit(0)
for step in range(5):
    dist.all_reduce(value)
    launcher.heartbeat(step)
if dist.get_rank() == 1:
    time.sleep(120)
dist.all_reduce(value)
"""

BLAME = ("process group 0 (default_pg), collective #6 gloo:all_reduce, sizes [[4]]: not entered by rank 1 "
         "(last entered #5); rank 0 inside it")


def test_the_rank_that_did_not_enter_the_sixth_all_reduce_is_the_root_cause(write_script, tmp_path):
    logs = tmp_path / "logs"
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "2", "--log-dir", str(logs),
                           write_script("sixth.py", SIXTH), str(tmp_path / "unused")], timeout=120)
    err = result.stderr
    assert result.returncode == 1, err
    assert re.search(r"^launcher: hang detected by \S+: rank 1 \(local rank 1\): no heartbeat for [\d.]+ s "
                     r"\(timeout 2 s\); did not enter collective #6 gloo:all_reduce, sizes \[\[4\]\] of process "
                     r"group 0 \(default_pg\)$", err, re.M), err
    assert f"Collectives (flight recorder, per process group):\n  {BLAME}\n  blamed: rank 1" in err, err
    # Beside the stacks: rank 0 shown inside all_reduce.
    assert re.search(r"^  rank 0: all_reduce \(distributed_c10d\.py:\d+\)", err, re.M), err
    # The failure report's root cause is rank 1, not rank 0 (the first the launcher stopped).
    root = err.split("Root cause (first failure):\n", 1)[1]
    assert re.match(r"  time +: .*\n  node +: .*\n  rank +: 1 \(local rank 1,", root), root
    assert "the hang is blamed on this rank" in root.split("\n  stderr", 1)[0], root
    (report_file,) = logs.glob("*/failure_report.json")
    report = json.loads(report_file.read_text())
    assert report["root_cause"]["rank"] == 1 and report["hang"]["blamed_ranks"] == [1], report
    # Each rank's whole record is kept beside the stacks, and bundled.
    out = tmp_path / "ticket.tar.gz"
    bundled = subprocess.run([*LAUNCHER, "bundle", str(logs), "--output", str(out)], env=launcher_env(),
                             capture_output=True, text=True, timeout=60)
    assert bundled.returncode == 0, bundled.stderr
    with tarfile.open(out) as archive:
        members = {m.name.split("/", 1)[1]: archive.extractfile(m).read() for m in archive.getmembers()}
    (record,) = [name for name in members if name.endswith("/hang_flight_recorder_attempt_0_rank_1.json")]
    entries = json.loads(members[record])["entries"]
    assert [e["profiling_name"] for e in entries] == ["gloo:all_reduce"] * 5, entries
    (stacks,) = [name for name in members if name.endswith("/hang_stacks_attempt_0.txt")]
    assert BLAME.encode() in members[stacks]


def test_status_shows_the_last_hang_after_a_restart(write_script, tmp_path):
    logs, release = tmp_path / "logs", tmp_path / "release"
    job = subprocess.Popen([*LAUNCHER, "--standalone", "--nproc-per-node", "2", "--hang-timeout", "2",
                            "--max-restarts", "1", "--log-dir", str(logs), write_script("sixth.py", SIXTH),
                            str(release)], env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        status: dict = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and job.poll() is None:
            shown = subprocess.run([*LAUNCHER, "status", str(logs), "--json"], env=launcher_env(),
                                   capture_output=True, text=True, timeout=60)
            status = json.loads(shown.stdout) if shown.returncode == 0 else {}
            job_status = status.get("job") or {}
            if job_status.get("last_hang") and job_status.get("restarts_used"):  # the second attempt runs
                break
            time.sleep(0.2)
        hang = status["job"]["last_hang"]
        assert hang["attempt"] == 0 and hang["blamed_ranks"] == [1], status
        assert hang["lines"][1] == BLAME, hang
        text = subprocess.run([*LAUNCHER, "status", str(logs)], env=launcher_env(), capture_output=True, text=True,
                              timeout=60).stdout
        assert re.search(r"^last hang \(attempt 0\): rank 1 \(local rank 1\): no heartbeat for .*; did not enter "
                         r"collective #6 ", text, re.M), text
        assert f"\n  {BLAME}\n" in text, text
    finally:
        release.touch()
        out, err = job.communicate(timeout=90)
    assert job.returncode == 0, err
