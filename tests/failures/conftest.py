"""Fixtures for failure-report tests: real worker processes, run to their end."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from launcher.failures import WorkerFailure


@dataclass
class FinishedWorker:
    """A worker process that ended, with what the agent would know about it."""

    pid: int
    returncode: int
    stdout: str
    stderr: str
    error_file: str
    ended_at: float

    def stderr_tail(self, lines: int = 10) -> list[str]:
        return self.stderr.splitlines()[-lines:]

    def failure(
        self, *, rank: int = 0, local_rank: int = 0, node: str = "node-a", role: str = "trainer"
    ) -> WorkerFailure:
        code = self.returncode
        return WorkerFailure(
            node=node,
            rank=rank,
            local_rank=local_rank,
            role=role,
            pid=self.pid,
            exitcode=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            timestamp=self.ended_at,
            error_file=self.error_file,
            stderr_tail=self.stderr_tail(),
        )


RunWorker = Callable[..., FinishedWorker]


@pytest.fixture
def run_worker(tmp_path: Path) -> RunWorker:
    """Run a Python script as a worker with ``TORCHELASTIC_ERROR_FILE`` set.

    ``send`` is a signal to deliver once the script prints ``ready`` on stdout.
    """
    counter = iter(range(1000))

    def run(
        source: str, *, send: int | None = None, error_file: bool = True, timeout: float = 120
    ) -> FinishedWorker:
        index = next(counter)
        script = tmp_path / f"worker{index}.py"
        script.write_text(textwrap.dedent(source))
        err_path = tmp_path / f"error{index}.json"
        env = dict(os.environ)
        env.pop("TORCHELASTIC_ERROR_FILE", None)
        if error_file:
            env["TORCHELASTIC_ERROR_FILE"] = str(err_path)
        proc = subprocess.Popen(
            [sys.executable, "-u", str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        stdout_head = ""
        if send is not None:
            assert proc.stdout is not None
            stdout_head = proc.stdout.readline()
            assert stdout_head.strip() == "ready", stdout_head
            proc.send_signal(send)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"worker did not finish in {timeout} s: {err}")
        return FinishedWorker(proc.pid, proc.returncode, stdout_head + out, err, str(err_path), time.time())

    return run


#: A worker that waits to be signalled, with the default action restored for the signals the
#: tests send (a test runner started under nohup would otherwise pass SIGHUP's SIG_IGN down).
WAITING_WORKER = """
import signal, sys, time
for sig in (signal.SIGHUP, signal.SIGTERM):
    signal.signal(sig, signal.SIG_DFL)
print("some progress", file=sys.stderr)
print("ready", flush=True)
time.sleep(60)
"""
