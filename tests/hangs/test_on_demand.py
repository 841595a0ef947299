"""Stacks on demand from a running job: SIGUSR2 to the agent, ``launcher stacks``, and where
the stacks files go (next to the logs, --log-dir or not)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.background_job import BackgroundJob
from tests.conftest import LAUNCHER, launcher_env, run_launcher, unwrapped

# Each rank waits in a known function until the test creates the go file, and says it is ready from
# inside that wait. The wait calls only C functions (os.access, not os.path.exists), on one line: a
# stack taken at any moment has waiting_for_godot innermost, at the same line on every rank (a CI run
# once caught a rank inside genericpath.exists). The ready file (its pid, written aside first) is put
# in place from that same line: a ready file written before the call would let the test ask for
# stacks while a rank is still in <module>, on its way there.
GODOT = """
import os, sys, time

def waiting_for_godot(tmp, ready, go):  # (os.access(path, 0): os.F_OK, whether it exists)
    end = time.monotonic() + 60
    while not os.access(go, 0) and time.monotonic() < end: os.access(ready, 0) or os.rename(tmp, ready); time.sleep(.05)

ready = sys.argv[1] + "." + os.environ["RANK"]
with open(ready + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
waiting_for_godot(ready + ".tmp", ready, sys.argv[2])
"""


class Job(BackgroundJob):
    """A launcher job of GODOT's ranks, started in the background (--standalone: a free port)."""

    def __init__(self, script: str, tmp_path: Path, flags: list[str], nproc: int = 2) -> None:
        self.ready = tmp_path / "ready"
        self.nproc = nproc
        super().__init__(["--standalone", "--nproc-per-node", str(nproc), *flags, script, str(self.ready),
                          str(tmp_path / "go")], tmp_path / "go")

    def wait_ready(self) -> None:
        self.wait_for_ranks([Path(f"{self.ready}.{rank}") for rank in range(self.nproc)], "the ranks")


@pytest.fixture
def start_job(write_script: Callable[[str, str], str], tmp_path: Path) -> Iterator[Callable[[list[str]], Job]]:
    """``start_job(flags)``: a running :class:`Job`, ended (its ranks let go) after the test."""
    jobs: list[Job] = []

    def start(flags: list[str]) -> Job:
        jobs.append(Job(write_script("godot.py", GODOT), tmp_path, flags))
        return jobs[-1]

    yield start
    for job in jobs:
        if job.process.returncode is None:
            job.finish()


def stacks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAUNCHER, "stacks", *args], env=launcher_env(), capture_output=True, text=True,
                          timeout=60)


def test_without_hang_detection_sigusr2_does_not_kill_the_agent_and_says_how(start_job):
    job = start_job([])
    job.wait_ready()
    os.kill(job.process.pid, signal.SIGUSR2)
    asked = stacks(str(job.process.pid))
    code, stderr = job.finish()
    assert code == 0, stderr
    hints = [line for line in stderr.splitlines() if line.startswith("launcher: no stacks: ")]
    assert len(hints) == 2 and "--hang-timeout" in hints[0], stderr
    assert asked.returncode == 0, asked.stderr
    assert "it runs no hang detection" in asked.stdout


def test_launcher_stacks_prints_a_running_jobs_report_from_its_log_dir(start_job, tmp_path):
    logs = tmp_path / "logs"
    job = start_job(["--hang-timeout", "60", "--log-dir", str(logs)])
    job.wait_ready()
    [agent_file] = logs.glob("*/agent.json")
    assert json.loads(agent_file.read_text())["pid"] == job.process.pid
    asked = stacks(str(logs))  # the --log-dir: the run's directory is found under it
    code, stderr = job.finish()
    assert code == 0, stderr
    assert asked.returncode == 0, asked.stderr
    assert re.search(r"^  ranks 0-1: waiting_for_godot \(godot\.py:\d+\) <- <module>", asked.stdout, re.M), \
        asked.stdout
    [stacks_file] = logs.glob("*/stacks_attempt_0_1.txt")
    assert f"(agent pid {job.process.pid}): {stacks_file}" in unwrapped(asked.stdout), asked.stdout
    assert "in waiting_for_godot" in stacks_file.read_text()
    assert "stacks asked for with SIGUSR2" in stderr and "hang detected" not in stderr, stderr
    assert not agent_file.exists()  # removed when the agent ends


def test_launcher_stacks_signals_only_a_launcher_agent(tmp_path):
    bystander = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                  "signal.signal(signal.SIGUSR2, lambda *a: None)\ntime.sleep(60)"])
    try:
        time.sleep(0.2)
        refused = stacks(str(bystander.pid))
        assert refused.returncode == 2 and "is not a launcher agent" in refused.stderr, refused.stderr
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    nobody = stacks(str(tmp_path))
    assert nobody.returncode == 1 and "no running launcher agent" in nobody.stderr, nobody.stderr
    for bad in ([], ["--json"], [str(tmp_path), "extra"], [str(tmp_path / "missing")], ["--wait", "nan", "1"]):
        assert stacks(*bad).returncode == 2, bad


def test_launcher_stacks_does_not_send_a_signal_the_agent_forwards(start_job, tmp_path):
    logs = tmp_path / "logs"
    job = start_job(["--hang-timeout", "60", "--log-dir", str(logs), "--signals-to-handle", "SIGTERM,SIGUSR2"])
    job.wait_ready()
    refused = stacks(str(job.process.pid))
    assert refused.returncode == 2 and "forwards SIGUSR2" in refused.stderr, refused.stderr
    assert not list(logs.glob("*/agent.json"))  # no dumps on SIGUSR2: nothing to find there
    code, stderr = job.finish()
    assert code == 0, stderr


def test_without_log_dir_the_stacks_are_kept_next_to_the_logs(start_job):
    """The stacks file goes into the run's (temporary) log directory, which is then kept, even
    when the job succeeds."""
    job = start_job(["--hang-timeout", "60"])
    job.wait_ready()
    os.kill(job.process.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 30
    root = Path(os.environ["TMPDIR"])  # tests/hangs/conftest.py: private to this test
    while not list(root.glob("launcher_*/*/stacks_attempt_0_1.txt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    code, stderr = job.finish()
    assert code == 0, stderr
    [stacks_file] = root.glob("launcher_*/*/stacks_attempt_0_1.txt")
    assert f"worker logs kept in {stacks_file.parent}" in unwrapped(stderr), stderr
    assert f"Full stacks: {stacks_file} (on " in unwrapped(stderr), stderr


def test_a_hang_without_log_dir_puts_its_stacks_with_the_failure_report(write_script):
    script = write_script(
        "stuck.py",
        """
        import time
        import launcher

        def stuck_in_known_function():
            time.sleep(60)

        launcher.heartbeat()
        stuck_in_known_function()
        """,
    )
    result = run_launcher(["--standalone", "--hang-timeout", "1", script], timeout=60)
    assert result.returncode == 1, result.stderr
    stderr = unwrapped(result.stderr)
    kept = re.search(r"worker logs kept in (\S+)", stderr)
    assert kept, stderr
    run_dir = Path(kept.group(1))
    assert (run_dir / "hang_stacks_attempt_0.txt").is_file()
    assert f"Full stacks: {run_dir / 'hang_stacks_attempt_0.txt'} (on " in stderr, stderr
    report = json.loads((run_dir / "failure_report.json").read_text())
    assert report["hang"]["nodes"][0]["stacks_file"] == str(run_dir / "hang_stacks_attempt_0.txt")
