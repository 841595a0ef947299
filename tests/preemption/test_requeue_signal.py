"""``--requeue``: Slurm stops the requeued step as soon as ``scontrol requeue`` returns, and that
second signal must not cut off the line that says the job was requeued."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import LAUNCHER, launcher_env

#: scontrol as a Slurm job that may be requeued answers it; ``requeue`` gets the agent stopped
#: (SIGTERM) before it returns, as slurmctld's cancel of the step can.
SCONTROL = """#!/bin/sh
case "$1 $2" in
  "show config") echo "KillWait = 30";;
  "show job") echo "JobId=42 Requeue=1 JobState=RUNNING Restarts=0";;
  requeue*) echo requeue >> "$0.calls"; kill -TERM "$PPID"; sleep 0.5;;
esac
"""

WORKER = """import os, sys, time
open(os.path.join(sys.argv[1], "started"), "w").close()
time.sleep(120)
"""


def test_slurms_stop_during_the_requeue_waits_for_the_requeued_line(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(SCONTROL)
    scontrol.chmod(0o755)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = launcher_env({"SLURM_JOB_ID": "42", "PATH": f"{bin_dir}:{launcher_env()['PATH']}"})
    agent = subprocess.Popen([*LAUNCHER, "--standalone", "--nproc-per-node", "1", "--requeue",
                              "--preemption-grace", "1", str(worker), str(tmp_path)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (tmp_path / "started").exists(), agent.communicate(timeout=30)[0] if agent.poll() is not None else ""
        agent.send_signal(signal.SIGTERM)  # the preemption: the worker ignores the notice, the grace ends
        output, _ = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    calls = bin_dir / "scontrol.calls"
    assert calls.exists() and calls.read_text() == "requeue\n", output
    lines = output.splitlines()
    requeued = [i for i, line in enumerate(lines) if "requeued Slurm job 42 (restart 1)" in line]
    hurried = [i for i, line in enumerate(lines) if "received SIGTERM again: exiting at once (143)" in line]
    assert len(requeued) == 1 and len(hurried) == 1 and requeued[0] < hurried[0], output
    assert agent.returncode == 128 + signal.SIGTERM, output
