"""``launcher bundle LOGDIR``: a failed job's report, error files, output tails, versions and the
environment with its secrets redacted, in one archive; bad input is one line."""

from __future__ import annotations

import stat
import subprocess
import tarfile

from tests.conftest import LAUNCHER, launcher_env

# Rank 1 fails only once rank 0 has printed its last line: else rank 0 may be stopped before it
# does, and its tail would end earlier.
FAILING = """
import os, sys, time
from pathlib import Path
printed = Path(sys.argv[1]) / "printed-0"
for i in range(500):
    print("line", i, "of rank", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "0":
    printed.touch()
    time.sleep(60)
deadline = time.monotonic() + 60
while not printed.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
raise RuntimeError("rank 1 gives up")
"""


def test_a_failed_job_is_bundled_with_its_secrets_redacted(write_script, tmp_path):
    script = write_script("failing.py", FAILING)
    logs = tmp_path / "logs"
    job = subprocess.run([*LAUNCHER, "--standalone", "--nproc-per-node", "2", "--log-dir", str(logs), "--tee", "3",
                          script, str(tmp_path)], env=launcher_env(), capture_output=True, text=True, timeout=120)
    assert job.returncode == 1, job.stderr
    out = tmp_path / "ticket.tar.gz"
    env = launcher_env({"MY_API_TOKEN": "hunter2", "DB_URL": "postgres://me:s3cret@db/x", "PLAIN": "visible"})
    result = subprocess.run([*LAUNCHER, "bundle", str(logs), "--output", str(out)], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and str(out) in result.stdout, result
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with tarfile.open(out) as archive:
        members = {m.name.split("/", 1)[1]: archive.extractfile(m).read().decode() for m in archive.getmembers()}
    names = sorted(members)
    assert "versions.txt" in names and "environment.txt" in names, names
    assert members["versions.txt"].startswith("launcher "), members["versions.txt"]
    environment = members["environment.txt"]
    assert "MY_API_TOKEN=<redacted>" in environment and "PLAIN=visible" in environment, environment
    assert "DB_URL=postgres://me:<redacted>@db/x" in environment, environment
    assert not any("hunter2" in text or "s3cret" in text for text in members.values())
    report = [n for n in names if n.endswith("/failure_report.json")]
    assert len(report) == 1 and "rank 1 gives up" in members[report[0]], names
    (tail,) = [n for n in names if n.endswith("attempt_0/1/stderr.tail.log")]
    assert "RuntimeError: rank 1 gives up" in members[tail], members[tail]
    (stdout_tail,) = [n for n in names if n.endswith("attempt_0/0/stdout.tail.log")]
    lines = members[stdout_tail].splitlines()
    assert len(lines) <= 201 and lines[-1] == "line 499 of rank 0", lines[-3:]


def test_bad_bundle_input_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    cases = {
        (str(tmp_path / "empty"),): "is not a launcher job's log directory",
        (str(tmp_path / "missing"),): "is not a directory",
        (str(tmp_path), "--bogus"): "unknown argument '--bogus'",
        (): "usage: launcher bundle",
    }
    for args, words in cases.items():
        result = subprocess.run([*LAUNCHER, "bundle", *args], env=launcher_env(), capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2 and words in result.stderr, (args, result)
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, (args, result)
