"""The agent's side of the watchdog (see ``_watchdog_main.py``), and the job's containment.

The watchdog is a separate tiny process in its own session (and outside the job's cgroup). When
the agent's pipe to it closes without a goodbye, it kills every process of the job: the job's
cgroup where there is one (``containment.py``: every process the job started, whatever its session
or environment), whatever carries the job's token in its environment (workers and everything they
started, data-loader processes, shells, double-forked daemons in sessions of their own, even a
worker whose start the agent never got to register), and whatever is in a registered worker's
session or below it (and below an orphan the agent adopted as a child subreaper). Only if the
watchdog cannot run do workers fall back to the parent-death signal, which kills the worker itself
but not what it started (the agent's own stop-time sweep still runs on every clean stop).

The watchdog owns the job's :class:`~launcher.containment.containment.Containment`: its set-up starts
when the agent starts the watchdog (just before its process, or after it where the command line
spawned the process early), creates the job's cgroup only once the watchdog runs (which is told
where it goes, and removes it if the agent dies after creating it), and it is torn down just
before the watchdog is told goodbye.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from launcher.containment._watchdog_main import TOKEN_VARIABLE
from launcher.containment.containment import Containment

_SCRIPT = os.path.join(os.path.dirname(__file__), "_watchdog_main.py")


class Watchdog:
    """Handle to the watchdog process of one agent."""

    def __init__(self, own_process: bool = False) -> None:
        """``own_process``: the agent owns this process (the command line, not the Python API), so
        the containment may move it into the job's cgroup or make it a child subreaper."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = False  # start() ran: the containment is being set up
        #: Random, per agent: marks the environment of every process of this job (see ``job_env``).
        self.token = os.urandom(16).hex()
        self.containment = Containment(self.token, own_process, register=self._register)

    def spawn(self) -> None:
        """Start the watchdog's process only (unless it runs); :meth:`start` sets the containment up later.

        The command line calls this first thing (before loading the plugins, whose flags it then
        reads; not for --help or --version): the watchdog's interpreter then
        boots on a core the agent leaves idle while it builds its plan, instead of beside the
        workers as they start. Nothing of the job exists yet, so :meth:`dismiss` may end it without
        a sweep if the plan is refused. The watchdog is told where the job's cgroup will go; it is
        created only once the watchdog runs, so an agent killed at any point leaves nothing behind.
        """
        if self._proc is not None:
            return
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _SCRIPT, self.token, *self.containment.locate()],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError:
            self._proc = None

    def start(self) -> bool:
        """Start the watchdog (unless :meth:`spawn` did), then the job's containment; whether the
        watchdog is running."""
        if not self._started:
            self._started = True
            self.containment.prepare()
            try:
                self.spawn()
            finally:
                # Only now, with the watchdog outside it and ready to remove it.
                self.containment.watchdog_started()
        return self.running

    def dismiss(self) -> None:
        """End a watchdog whose job never started (:meth:`start` was not called): it has nothing
        to kill, so it is killed itself rather than told to sweep."""
        if self._started or self._proc is None:
            return
        proc, self._proc = self._proc, None
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(OSError, ValueError):
            assert proc.stdin is not None
            proc.stdin.close()
        proc.wait()

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

    def death_notice(self, argv: list[str] | None) -> None:
        """Run ``argv`` once the job's processes are killed, if the agent dies (``None``: nothing).

        The rendezvous gives it (``death_notice()`` of the handler): a command that reports this
        node gone at once, where the rendezvous cannot see the agent's death by itself (etcd).
        """
        if argv and any("\0" in part or "\n" in part for part in argv):
            raise ValueError("a death notice's arguments cannot hold NUL or newline characters")
        self._send("!" + "\0".join(argv or ()))

    def _register(self, pid: int, on: bool) -> None:
        (self.watch if on else self.forget)(pid)

    def stop(self, helpers: tuple[int, ...] = ()) -> None:
        """Clean shutdown: end the job's containment (killing what is left in it), then the watchdog
        exits without killing anything."""
        if not self._started:
            self.dismiss()
            return
        self.containment.close(helpers=(*helpers, *((self.pid,) if self.pid else ())))
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
