"""``--preemption-state-dir``: launcher's own count of a job's preemptions across runs, so a job run
again after exit status 75 (a Kubernetes container restarted, a wrapper script) knows it continues."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launcher.errors import UsageError
from launcher.preemption.record import RECORD_NAME, PreemptionRecord, check_state_dir

from tests.conftest import LAUNCHER, launcher_env

# Each rank says which continuation it is, then waits for the notice (saves, exits 0) or, with
# FINISH set, exits 0 at once: the job succeeds.
WORKER = """
import os, sys, time
from pathlib import Path
import launcher
state = Path(sys.argv[1])
rank = os.environ["RANK"]
(state / f"count-{rank}").write_text(os.environ["LAUNCHER_PREEMPTION_COUNT"])
if os.environ.get("FINISH"):
    sys.exit(0)
launcher.wait_for_preemption(120)
"""


def _run(tmp_path: Path, state_dir: Path, *, preempt: bool) -> tuple[int, list[str], str]:
    """One run of the job: its exit status, each rank's LAUNCHER_PREEMPTION_COUNT, its stderr."""
    state = tmp_path / f"state-{time.monotonic_ns()}"
    state.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = launcher_env({} if preempt else {"FINISH": "1"})
    env.pop("SLURM_RESTART_COUNT", None)
    process = subprocess.Popen([*LAUNCHER, "--standalone", "--nproc-per-node", "2", "--preemption-grace", "30",
                                "--preemption-state-dir", str(state_dir), str(script), str(state)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if preempt:
        deadline = time.monotonic() + 60
        while len(list(state.glob("count-*"))) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    counts = [(state / f"count-{rank}").read_text() for rank in (0, 1) if (state / f"count-{rank}").exists()]
    return process.returncode, counts, stderr


def test_a_job_run_again_after_a_preemption_knows_it_continues_until_it_succeeds(tmp_path):
    shared = tmp_path / "ckpt"
    shared.mkdir()
    record = shared / RECORD_NAME
    code, counts, stderr = _run(tmp_path, shared, preempt=True)
    assert (code, counts) == (75, ["0", "0"]), stderr  # a first run
    assert json.loads(record.read_text())["count"] == 1, stderr
    code, counts, stderr = _run(tmp_path, shared, preempt=True)
    assert (code, counts) == (75, ["1", "1"]), stderr  # the first continuation, preempted again
    code, counts, stderr = _run(tmp_path, shared, preempt=False)
    assert (code, counts) == (0, ["2", "2"]), stderr  # the second one finishes the job
    assert not os.path.exists(record), "a job that succeeded leaves no record"
    assert os.listdir(shared) == [], os.listdir(shared)
    code, counts, stderr = _run(tmp_path, shared, preempt=False)
    assert (code, counts) == (0, ["0", "0"]), stderr  # the next job with that id is a first run


def test_the_count_is_the_larger_of_slurms_and_launchers(tmp_path, monkeypatch):
    from launcher.preemption.watch import PreemptionWatch

    class Plan:
        run_id = "job"
        node = "n"

    PreemptionRecord(str(tmp_path), "job").preempted("SIGTERM", "n")
    settings = type("S", (), {"state_dir": str(tmp_path), "grace": 5.0, "signals": (15,), "requeue": False})()
    watch = PreemptionWatch(Plan(), settings, lambda *a, **k: None)  # type: ignore[arg-type]
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    assert watch.continuation() == 3
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert watch.continuation() == 1


def test_a_broken_record_counts_as_a_first_run_and_is_replaced(tmp_path, caplog):
    record = PreemptionRecord(str(tmp_path), "job")
    Path(record.path).write_text("{half a rec")
    assert record.count == 0
    assert "cannot be read" in caplog.text
    record.preempted("SIGUSR1", "node-a")
    assert json.loads(Path(record.path).read_text())["count"] == 1
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(record.path)]  # no temporary file left


def _a_file(path: Path) -> Path:
    path.write_text("")
    return path


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p / "missing", "no such directory"),
    (lambda p: _a_file(p / "file"), "is not a directory"),
])
def test_a_state_dir_that_cannot_hold_the_record_is_a_usage_error(tmp_path, make, message):
    with pytest.raises(UsageError, match=message):
        check_state_dir(str(make(tmp_path)))
    assert check_state_dir(None) is None and check_state_dir("  ") is None
    assert check_state_dir(str(tmp_path)) == str(tmp_path)


def test_a_bad_state_dir_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('no worker may start')\n")
    result = subprocess.run([*LAUNCHER, "--standalone", "--preemption-state-dir", str(tmp_path / "nope"), str(script)],
                            env=launcher_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--preemption-state-dir" in lines[0] and "no such directory" in lines[0], lines
