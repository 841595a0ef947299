"""The agent's side of the watchdog (see ``_watchdog_main.py``).

The watchdog is a separate tiny process in its own session. When the agent's pipe to it closes
without a goodbye, it kills every worker with everything the workers started (data-loader
processes, shells, daemons that left the worker's session), walking the process tree while it is
still intact. Only if the watchdog cannot run do workers fall back to the parent-death signal,
which kills the worker itself but not what it started.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

_SCRIPT = os.path.join(os.path.dirname(__file__), "_watchdog_main.py")


class Watchdog:
    """Handle to the watchdog process of one agent."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> bool:
        """Start the watchdog (once); whether it is running."""
        if self._proc is None:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", _SCRIPT],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError:
                return False
        return self.running

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
