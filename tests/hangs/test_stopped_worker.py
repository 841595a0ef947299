"""Single node, real workers: a worker that is stopped (SIGSTOP, state T) when the launcher stops
the job is not waited for through the grace period (issue 45).

A stopped process acts on no signal but SIGKILL until it is continued: judged hung, it is killed
at once once its stacks are taken, and its report says it was hung and stopped; stopped while the
job ends for another reason, it is continued right after its SIGTERM, and acts on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import LAUNCHER, launcher_env, unwrapped
from tests.hangs.test_hang_detection import wait_gone

#: Longer than either test may take: a stop that waited it out would fail them.
GRACE = 60

# Rank 1 starts a child in a session of its own, beats once, then stops itself; rank 0 beats on.
STOPS_ITSELF = """
import os, signal, subprocess, sys, time
import launcher

rank = int(os.environ["RANK"])
out = sys.argv[1]
open(os.path.join(out, f"pid.{rank}"), "w").write(str(os.getpid()))
launcher.heartbeat()
if rank == 1:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    open(os.path.join(out, "child"), "w").write(str(child.pid))
    open(os.path.join(out, "stopped_at"), "w").write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGSTOP)
while True:
    launcher.heartbeat()
    time.sleep(0.05)
"""

# Rank 1 notes SIGTERM and stops itself; rank 0 fails once rank 1 is stopped.
FAILS_BESIDE_A_STOPPED_RANK = """
import os, signal, sys, time

rank = int(os.environ["RANK"])
out = sys.argv[1]
open(os.path.join(out, f"pid.{rank}.tmp"), "w").write(str(os.getpid()))
os.replace(os.path.join(out, f"pid.{rank}.tmp"), os.path.join(out, f"pid.{rank}"))

def on_term(signum, frame):
    open(os.path.join(out, "got_sigterm"), "w").write(repr(time.time()))
    sys.exit(143)

if rank == 1:
    signal.signal(signal.SIGTERM, on_term)
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(600)
peer = os.path.join(out, "pid.1")
while not os.path.exists(peer):
    time.sleep(0.05)
stat = f"/proc/{open(peer).read()}/stat"
while open(stat).read().rsplit(")", 1)[1].split()[0] != "T":
    time.sleep(0.05)
open(os.path.join(out, "failed_at"), "w").write(repr(time.time()))
sys.exit("rank 0 fails while rank 1 is stopped")
"""


def _pids(out: Path, names: list[str]) -> list[int]:
    return [int((out / name).read_text()) for name in names]


def _resume_and_kill(pids: list[int]) -> None:
    """What a failed test leaves: nothing (a stopped process would otherwise stay forever)."""
    for pid in pids:
        for signum in (signal.SIGKILL, signal.SIGCONT):
            with contextlib.suppress(OSError):
                os.kill(pid, signum)


def test_a_stopped_hung_worker_is_named_killed_at_once_and_is_the_root_cause(write_script, tmp_path):
    script = write_script("stops_itself.py", STOPS_ITSELF)
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    try:
        result = subprocess.run(
            [*LAUNCHER, "--nproc-per-node", "2", "--hang-timeout", "2", "--shutdown-timeout", str(GRACE),
             "--log-dir", str(logs), script, str(out)],
            env=launcher_env(), capture_output=True, text=True, timeout=GRACE + 60,
        )
        ended = time.time()
    finally:
        leftovers = [p for p in out.glob("*") if p.name.startswith("pid.") or p.name == "child"]
        _resume_and_kill([int(p.read_text()) for p in leftovers if p.read_text().strip()])
    stderr = unwrapped(result.stderr)
    assert result.returncode == 1, stderr
    took = ended - float((out / "stopped_at").read_text())
    print(f"\nstopped worker: job ended {took:.1f} s after the SIGSTOP (--hang-timeout 2, --shutdown-timeout {GRACE})")
    # The hang is seen within the timeout and a check or two; the stop then waits for nothing.
    assert took < GRACE / 2, stderr

    # Named hung, and stopped; its flight record is missing because it is stopped, not for lack of a hook.
    assert "rank 1 on" in stderr and "its process is stopped (state T)" in stderr, stderr
    assert "no record from rank 1: the process is stopped (state T" in stderr, stderr
    assert "-I, -S or -E" not in stderr, stderr
    assert "is hung and stopped (state T): killing it now" in stderr, stderr
    assert "did not exit within" not in stderr, stderr

    # Nothing is left: the workers, and the child rank 1 started in a session of its own.
    assert wait_gone(_pids(out, ["pid.0", "pid.1", "child"])) == []

    [report_path] = logs.glob("*/failure_report.json")
    report = json.loads(report_path.read_text())
    root = report["root_cause"]
    assert (root["rank"], root["signal_name"], root["hung"], root["stopped"]) == (1, "SIGKILL", True, True), root
    assert "hung" in root["explanation"] and "state T" in root["explanation"], root
    assert report["hang"]["blamed_ranks"] == [1]
    [entry] = [e for node in report["hang"]["nodes"] for e in node["ranks"] if e["rank"] == 1]
    assert entry["stopped"] is True and entry["hung"] is True


def test_a_stopped_worker_is_continued_when_the_job_stops_for_another_rank(write_script, tmp_path):
    script = write_script("fails_beside.py", FAILS_BESIDE_A_STOPPED_RANK)
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    started = time.time()
    try:
        result = subprocess.run(
            [*LAUNCHER, "--nproc-per-node", "2", "--shutdown-timeout", str(GRACE), "--log-dir", str(logs),
             script, str(out)],
            env=launcher_env(), capture_output=True, text=True, timeout=GRACE + 60,
        )
        ended = time.time()
    finally:
        _resume_and_kill([int(p.read_text()) for p in out.glob("pid.?")])
    stderr = unwrapped(result.stderr)
    assert result.returncode == 1, stderr
    # Rank 1 acted on its SIGTERM (its handler ran): it was continued, not killed at the grace's end.
    got_term = float((out / "got_sigterm").read_text())
    failed_at = float((out / "failed_at").read_text())
    print(f"\nstopped worker beside a failure: SIGTERM acted on {got_term - failed_at:.1f} s after the failure, "
          f"job took {ended - started:.1f} s (--shutdown-timeout {GRACE})")
    assert got_term - failed_at < GRACE / 2, stderr
    assert "did not exit within" not in stderr, stderr
    assert wait_gone(_pids(out, ["pid.0", "pid.1"])) == []
    [report_path] = logs.glob("*/failure_report.json")
    root = json.loads(report_path.read_text())["root_cause"]
    assert (root["rank"], root["exitcode"], root["hung"]) == (0, 1, False), root


def test_the_stacks_of_a_stopped_process_say_it_is_stopped_without_waiting(tmp_path):
    from launcher.hangs import flightrec, stacks

    # Armed as the start-up hook arms a worker, then stopped.
    path = tmp_path / "stacks"
    pipe, record = str(tmp_path / "fr.pipe"), str(tmp_path / "fr.json")
    env = {"PYTHONPATH": stacks.SITE_DIR}
    stacks.arm_environment(env, str(path))
    flightrec.arm_environment(env, pipe, record)
    child = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"],
                             env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 30
        while not (stacks.armed_pid(str(path)) and stacks.native_state(child.pid).startswith("T")):
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.02)
        began = time.monotonic()
        dumps = stacks.collect([(0, child.pid, str(path))], {0: {child.pid}}, timeout=10)
        records = flightrec.request([(0, pipe, record)], timeout=10, pids={0: child.pid})
        waited = time.monotonic() - began
    finally:
        child.kill()
        child.wait()
    assert "stopped (state T" in dumps[0].note and dumps[0].native.startswith("T"), dumps[0]
    assert records[0]["launcher_note"] == stacks.STOPPED_NOTE
    assert waited < 5, waited  # neither waited its 10 s for an answer that cannot come
