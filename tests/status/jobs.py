"""Real jobs for the status tests: WORKER's ranks run until the test lets them go."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.background_job import BackgroundJob
from tests.conftest import LAUNCHER, launcher_env

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
step = 0
while not os.path.exists(go) and time.monotonic() < end:
    step += 1
    launcher.heartbeat(step)
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


class Job(BackgroundJob):
    """A two-rank job of WORKER with ``--log-dir``, in the background."""

    def __init__(self, script: str, tmp_path: Path, flags: list[str], env: dict[str, str]) -> None:
        self.ready, self.log_dir = tmp_path / "ready", tmp_path / "logs"
        super().__init__(["--standalone", "--nproc-per-node", "2", "--log-dir", str(self.log_dir),
                          "--hang-timeout", "120", *flags, script, str(self.ready), str(tmp_path / "go")],
                         tmp_path / "go", env)

    def pids(self, attempt: int = 0) -> dict[int, int]:
        """Each rank's pid once every rank of ``attempt`` is up."""
        files = [Path(f"{self.ready}.{attempt}.{rank}") for rank in (0, 1)]
        pids = self.wait_for_ranks(files, f"the ranks of attempt {attempt}")
        return {rank: pids[f] for rank, f in enumerate(files)}
