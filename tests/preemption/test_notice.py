"""The worker's side: launcher.preempted() and friends outside launcher, and on one node under it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import LAUNCHER, launcher_env

OUTSIDE = """
import sys, threading, time
import launcher
called = []
launcher.on_preemption(lambda: called.append(1))
start = time.monotonic()
waited = launcher.wait_for_preemption(30)
print(launcher.preempted(), launcher.preemption_time_left(), waited, time.monotonic() - start < 20,
      threading.active_count(), called, "torch" in sys.modules, "launcher.agent.agent" in sys.modules)
"""

# Each rank: a callback and a wait, then it saves (a file) and exits; READY says it is waiting.
WORKER = """
import json, os, sys, time
from pathlib import Path
import launcher
state = Path(sys.argv[1])
rank = os.environ["RANK"]
assert not launcher.preempted() and launcher.preemption_time_left() is None
launcher.on_preemption(lambda: (state / f"called-{rank}").write_text(str(launcher.preemption_time_left())))
(state / f"ready-{rank}").write_text(str(os.getpid()))
if not launcher.wait_for_preemption(120):  # at once when preemption handling is off
    (state / f"off-{rank}").touch()
    time.sleep(120)
left = launcher.preemption_time_left()
time.sleep(0.3)  # the save
(state / f"saved-{rank}").write_text(json.dumps({"left": left, "preempted": launcher.preempted(),
                                                "count": os.environ["LAUNCHER_PREEMPTION_COUNT"]}))
"""


def test_outside_launcher_nothing_is_preempted_and_nothing_waits():
    result = subprocess.run([sys.executable, "-c", OUTSIDE], env=launcher_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    # Not preempted, no time left, no wait, no thread, no callback; neither torch nor the agent loaded.
    assert result.stdout.split() == ["False", "None", "False", "True", "1", "[]", "False", "False"], result.stdout


def _job(tmp_path: Path, *flags: str, ready: str = "ready-*") -> tuple[subprocess.Popen[str], Path]:
    state = tmp_path / "state"
    state.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = launcher_env({"LAUNCHER_EVENTS_FILE": str(tmp_path / "events.jsonl")})
    process = subprocess.Popen([*LAUNCHER, "--standalone", "--nproc-per-node", "2", "--event-log-handler", "jsonl",
                                *flags, str(script), str(state)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(state.glob(ready))) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process, state


def test_every_rank_is_told_calls_back_saves_and_the_job_ends_preempted(tmp_path):
    process, state = _job(tmp_path, "--preemption-grace", "60")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 75, stderr
    for rank in (0, 1):
        saved = json.loads((state / f"saved-{rank}").read_text())
        assert saved["preempted"] and 0 < saved["left"] <= 60, saved
        assert saved["count"] == "0", saved  # not a continuation
        assert 0 < float((state / f"called-{rank}").read_text()) <= 60
    assert ("job preempted (SIGTERM received here); 2 of 2 local worker(s) exited cleanly within the 60 s grace; "
            "exit status 75") in stderr
    assert "[launcher] WARNING: node " in stderr and "ERROR" not in stderr, stderr
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    preempted = [e for e in events if e["type"] == "preempted"]
    assert len(preempted) == 1 and preempted[0]["data"]["signal"] == "SIGTERM", events
    assert preempted[0]["data"]["grace"] == 60.0
    assert not any(e["type"] == "job_failed" for e in events), events


def test_without_the_flags_sigterm_keeps_torchruns_meaning(tmp_path):
    process, state = _job(tmp_path, ready="off-*")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert not list(state.glob("saved-*")) and not list(state.glob("called-*")), stderr
    assert len(list(state.glob("off-*"))) == 2, stderr
    assert "preempted" not in stderr


def test_a_worker_signalled_directly_is_told_not_killed(tmp_path):
    """Slurm signals every process of the job step, the workers too: a worker that uses the API
    learns of the preemption from the signal itself and still has the grace to save."""
    process, state = _job(tmp_path, "--preemption-grace", "60")
    for rank in (0, 1):  # the workers first: without the handler they would die of it at once
        os.kill(int((state / f"ready-{rank}").read_text()), signal.SIGTERM)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 75, stderr
    for rank in (0, 1):
        assert json.loads((state / f"saved-{rank}").read_text())["preempted"], stderr
    assert "2 of 2 local worker(s) exited cleanly" in stderr, stderr
