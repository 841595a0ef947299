"""The agent's side of the watchdog (see ``_watchdog_main.py``).

The watchdog is a separate tiny process in its own session. When the agent's pipe to it closes
without a goodbye, it kills every process of the job: whatever carries the job's token in its
environment (workers and everything they started, data-loader processes, shells, double-forked
daemons in sessions of their own, even a worker whose start the agent never got to register), and
whatever is in a registered worker's session or below it. Only if the watchdog cannot run do
workers fall back to the parent-death signal, which kills the worker itself but not what it started
(the agent's own stop-time sweep by token still runs on every clean stop).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from launcher.agent._watchdog_main import TOKEN_VARIABLE

_SCRIPT = os.path.join(os.path.dirname(__file__), "_watchdog_main.py")


class Watchdog:
    """Handle to the watchdog process of one agent."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        #: Random, per agent: marks the environment of every process of this job (see ``job_env``).
        self.token = os.urandom(16).hex()

    def start(self) -> bool:
        """Start the watchdog (once); whether it is running."""
        if self._proc is None:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", _SCRIPT, self.token],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError:
                return False
        return self.running

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pipe_fd(self) -> int | None:
        """The agent's end of the pipe (forked children must close it)."""
        if self._proc is None or self._proc.stdin is None:
            return None
        return self._proc.stdin.fileno()

    def _send(self, text: str) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self._proc.stdin.write(text.encode() + b"\n")
            self._proc.stdin.flush()

    def watch(self, pid: int) -> None:
        """Kill ``pid``'s session and descendants if the agent dies."""
        self._send(f"+{pid}")

    def forget(self, pid: int) -> None:
        self._send(f"-{pid}")

    def stop(self) -> None:
        """Clean shutdown: the watchdog exits without killing anything."""
        if self._proc is None:
            return
        self._send("exit")
        with contextlib.suppress(OSError, ValueError):
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        self._proc = None


def job_env(env: dict[str, str], token: str) -> dict[str, str]:
    """``env`` plus the job's token, kept after the tokens of any enclosing job (a launcher in a worker)."""
    outer = env.get(TOKEN_VARIABLE)
    return {**env, TOKEN_VARIABLE: f"{outer}:{token}" if outer else token}
