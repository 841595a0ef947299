"""A launcher job in the background whose ranks wait for the test: the status and hang tests' helper.

Each rank writes a ready file (its pid in it), then works until the test creates the go file;
:meth:`BackgroundJob.finish` creates it and collects the agent's exit status and stderr.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.conftest import LAUNCHER, launcher_env


class BackgroundJob:
    """``launcher ARGS`` started at once; ``go`` is the file that lets its ranks end."""

    def __init__(self, args: Sequence[str], go: Path, env: dict[str, str] | None = None) -> None:
        self.go = go
        self.process = subprocess.Popen(
            [*LAUNCHER, *args], env=launcher_env(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    def wait_for_ranks(self, files: Sequence[Path], what: str, timeout: float = 60.0) -> dict[Path, int]:
        """Each of ``files`` -> the pid written in it, once all are written; fails the test (with the
        agent's stderr) if the agent exits first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            texts = [f.read_text() if f.exists() else "" for f in files]
            if all(texts):
                return {f: int(text) for f, text in zip(files, texts, strict=True)}
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{what} did not start: {self.finish()}")

    def finish(self) -> tuple[int, str]:
        """Let the ranks go; the agent's exit status and stderr (killed if still running after 60 s)."""
        self.go.touch()
        try:
            _, stderr = self.process.communicate(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        return self.process.returncode, stderr
