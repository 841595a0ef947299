"""Starting one worker process, and knowing the moment it ends.

Each worker runs in a session of its own (so a forwarded signal reaches the worker and everything
it started, and a terminal's Ctrl-C reaches only the agent), with the parent-death signal set to
SIGKILL so that it cannot outlive an agent that is killed outright. Its stdout and stderr are
pipes the agent reads. Exit is observed through a file descriptor (a pidfd, or the
multiprocessing sentinel) that the agent's selector watches, so a worker's exit is noticed at
once, not at the next poll. With ``--preload`` a worker is forked from a template process instead
(:mod:`launcher.preload.preload`), and is still the agent's own child (:class:`ForkedWorker`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import multiprocessing.connection
    import multiprocessing.process

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc: Any = None


def _prctl() -> Any:
    global _libc
    if _libc is None:
        import ctypes  # only workers without a watchdog need it

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.prctl


def die_with_parent(expected_parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux).

    If the parent already died before the request took effect, exit at once: otherwise the
    request would be too late to matter.
    """
    _prctl()(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(1)


#: ``/proc/PID/stat`` states of a process that cannot act on a signal until it is continued:
#: stopped (SIGSTOP, SIGTSTP) and stopped by a tracer (a debugger).
STOPPED_STATES = frozenset("Tt")


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``R``, ``S``, ``T``...); ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name (in parentheses) may hold spaces and parentheses: the state follows the last ")".
    rest = stat[stat.rfind(b")") + 2 :]
    return rest[:1].decode("ascii", "replace") or None


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state ``T`` or ``t``): it acts on no signal but SIGKILL until continued."""
    return process_state(pid) in STOPPED_STATES


class WorkerProcess:
    """A running worker: its pid, a descriptor readable once it exits, and its exit status."""

    def __init__(self, local_rank: int, pid: int, started_at: float) -> None:
        self.local_rank = local_rank
        self.pid = pid
        self.started_at = started_at
        #: ``None`` while running; then 0, a positive exit code, or ``-signum``.
        self.returncode: int | None = None
        self.ended_at: float | None = None
        #: A function worker whose function returned and whose result the agent took: it waits
        #: for :meth:`FunctionWorker.release`, not running the worker's code any more.
        self.delivered = False
        #: The signal the agent sent to end it, if it did (``SIGKILL`` when it had to escalate).
        self.stop_signal: int | None = None
        #: Judged hung by ``--hang-timeout`` (its stacks taken): a stop kills it at once.
        self.hung = False
        #: It was stopped (state ``T``) when the agent stopped it: continued, or killed at once.
        self.was_stopped = False

    @property
    def ended_by_launcher(self) -> bool:
        """Whether it died of the signal the agent sent it to stop it (or of the SIGKILL after)."""
        code = self.returncode
        return (self.stop_signal is not None and code is not None and code < 0
                and -code in (self.stop_signal, int(signal.SIGKILL)))

    def fileno(self) -> int:
        raise NotImplementedError

    def poll(self) -> int | None:
        """Reap the process if it has exited; its return code or ``None``."""
        raise NotImplementedError

    def signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the worker's process group; whether anything received it.

        A worker that has not reached its ``setsid()`` yet (a spawned function worker still
        unpickling its arguments) leads no group: it gets the signal itself, else a stop would
        wait out its whole grace period for a process that was never told to stop.
        """
        try:
            os.killpg(self.pid, signum)
            return True
        except PermissionError:
            return False
        except ProcessLookupError:
            pass
        if self.returncode is not None:  # reaped: its pid may belong to another process by now
            return False
        try:
            os.kill(self.pid, signum)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def close(self) -> None:
        """Release the exit descriptor."""


class ChildWorker(WorkerProcess):
    """A worker that is this process's own child: its exit is seen through a pidfd."""

    _pidfd: int | None = None

    def fileno(self) -> int:
        if self._pidfd is None:
            raise OSError("pidfd_open is not available")
        return self._pidfd

    @property
    def has_exit_fd(self) -> bool:
        return self._pidfd is not None

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def _open_pidfd(pid: int) -> int | None:
    """A descriptor readable once ``pid`` exits, or ``None`` where pidfds are not available."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


class CommandWorker(ChildWorker):
    """A worker that runs a command (``python -u script.py``, ``python -m mod``, a binary)."""

    def __init__(self, local_rank: int, popen: subprocess.Popen[bytes], started_at: float) -> None:
        super().__init__(local_rank, popen.pid, started_at)
        self._popen = popen
        self._pidfd = _open_pidfd(popen.pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self._popen.poll()
            if code is not None:
                self.returncode = code
                self.ended_at = time.time()
        return self.returncode


def start_command(
    local_rank: int,
    argv: Sequence[str],
    env: Mapping[str, str],
    stdout_fd: int,
    stderr_fd: int,
    cpus: frozenset[int] | None = None,
    cwd: str | None = None,
    parent_death_signal: bool = True,
    cgroup: str | None = None,
) -> CommandWorker:
    """Start ``argv`` as a worker writing to the given pipe ends.

    ``parent_death_signal`` kills the worker itself when the agent dies; leave it off when a
    watchdog guards the worker, which kills its whole tree instead (the signal would kill the
    worker first and orphan its children before the watchdog could find them).
    ``cgroup``: a cgroup directory the worker moves itself into before it runs anything (the
    Python API's workers; the command line's are born in the agent's). Moved from outside after
    the start, a busy worker could fork before the move and leave that child outside.
    """
    agent_pid = os.getpid()
    if parent_death_signal:
        _prctl()  # resolve libc before forking: the child should only make the call
    procs = -1
    if cgroup is not None:
        with contextlib.suppress(OSError):  # then the caller moves it once started (and says why not)
            procs = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    def before_exec() -> None:
        # Runs in the child between fork and exec; keep it to system calls.
        if procs >= 0:
            with contextlib.suppress(OSError):
                os.write(procs, b"0")
        if parent_death_signal:
            die_with_parent(agent_pid)
        if cpus:
            os.sched_setaffinity(0, cpus)

    try:
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout_fd,
            stderr=stderr_fd,
            start_new_session=True,
            # Without a pre-exec function the child can be started with vfork, which is faster.
            preexec_fn=before_exec if (parent_death_signal or cpus or procs >= 0) else None,
            close_fds=True,
            cwd=cwd,
        )
    finally:
        if procs >= 0:
            os.close(procs)
    return CommandWorker(local_rank, popen, time.time())


class ForkedWorker(ChildWorker):
    """A worker forked from the ``--preload`` template (:mod:`launcher.preload.preload`).

    The template forks it twice and the agent is a child subreaper at that moment, so it is the
    agent's own child, as a :class:`CommandWorker` is: its status comes from ``waitpid`` and its
    exit is seen through a pidfd, the same way.
    """

    def __init__(self, local_rank: int, pid: int, started_at: float) -> None:
        super().__init__(local_rank, pid, started_at)
        self._pidfd = _open_pidfd(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost (never expected)
                pid, status = self.pid, 255 << 8
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                self.ended_at = time.time()
        return self.returncode


_subreaper_holds = 0


def set_child_subreaper(on: bool) -> None:
    """Make orphaned descendants re-parent to this process (``on``) or to init again (Linux).

    Calls nest: the flag is cleared when every ``on`` has had its ``off`` (the agent can be a
    subreaper for the whole job, see ``containment.py``, and ``--preload`` for each fork).
    """
    global _subreaper_holds
    _subreaper_holds = max(0, _subreaper_holds + (1 if on else -1))
    if _subreaper_holds == (1 if on else 0):
        _prctl()(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0)


class FunctionWorker(WorkerProcess):
    """A worker that runs a Python callable through multiprocessing (spawn, fork or forkserver).

    Once the callable has returned and its result is written, the worker says so on its channel
    and waits until the agent has taken the result and lets it go (:meth:`release`; as torchrun's
    workers wait until the agent has every local worker's return value): no worker leaves while
    its local peers still run their code, and the agent holds the result before the worker exits.
    """

    def __init__(self, local_rank: int, process: multiprocessing.process.BaseProcess, result_path: str,
                 started_at: float, channel: multiprocessing.connection.Connection) -> None:
        assert process.pid is not None
        super().__init__(local_rank, process.pid, started_at)
        self._process = process
        self.result_path = result_path
        self._channel: multiprocessing.connection.Connection | None = channel
        self._result: Any = None

    def channel_fd(self) -> int:
        """A descriptor readable once the worker's result is written (or the worker ended)."""
        assert self._channel is not None
        return self._channel.fileno()

    def take_result(self) -> bool:
        """Take the result the worker announced on its channel; False when it ended without one."""
        if self._channel is None:
            return self.delivered
        try:
            self._channel.recv_bytes()
        except (EOFError, OSError):  # it ended (failed, or exited from its code) without a result
            return False
        self._result = self._load()
        self.delivered = True
        return True

    def release(self) -> None:
        """Let the worker exit; one that already ended, or a channel already closed, is fine."""
        if self._channel is not None:
            with contextlib.suppress(OSError):
                self._channel.send_bytes(b"go")
            self._channel.close()
            self._channel = None

    def fileno(self) -> int:
        return self._process.sentinel

    has_exit_fd = True

    def poll(self) -> int | None:
        if self.returncode is None and not self._process.is_alive():
            self._process.join(0)
            self.returncode = self._process.exitcode
            self.ended_at = time.time()
        return self.returncode

    def result(self) -> Any:
        """The callable's return value (after a successful exit)."""
        return self._result if self.delivered else self._load()

    def _load(self) -> Any:
        import pickle

        with open(self.result_path, "rb") as handle:
            return pickle.load(handle)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        with contextlib.suppress(ValueError):
            self._process.close()


def _function_main(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    env: dict[str, str],
    stdout: multiprocessing.connection.Connection,
    stderr: multiprocessing.connection.Connection,
    result_path: str,
    agent_pid: int,
    cpus: frozenset[int] | None,
    parent_death_signal: bool,
    close_fds: tuple[int, ...],
    cgroup: str | None = None,
    channel: multiprocessing.connection.Connection | None = None,
) -> None:
    """Entry point of a function worker, in the child process."""
    if cgroup:  # the Python API's job cgroup: before anything here can start a process
        from launcher.containment._watchdog_main import move_to_cgroup

        with contextlib.suppress(OSError):
            move_to_cgroup(cgroup)
    os.setsid()
    # A forked child inherits every descriptor of the agent; the watchdog's pipe must not stay
    # open here, or the watchdog would never see the agent die.
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    if parent_death_signal:
        die_with_parent(agent_pid)
    if cpus:
        os.sched_setaffinity(0, cpus)
    os.dup2(stdout.fileno(), 1)
    os.dup2(stderr.fileno(), 2)
    stdout.close()
    stderr.close()
    os.environ.update(env)
    # No start-up hook runs in this process (multiprocessing starts it): do here what it does.
    if env.get("LAUNCHER_STACKS_FILE") or env.get("LAUNCHER_STRAGGLER_FILE"):
        from launcher.hangs.stacks import arm_here

        arm_here(env)  # --hang-timeout: claim the heartbeat, arm stack dumps
    if env.get("LAUNCHER_STRAGGLER_FILE"):  # --straggler-detection
        from launcher.stragglers.timing import install

        # Before fn runs, but torch.distributed may be imported already (spawn re-imports the
        # caller's main module, fork inherits it): install() wraps it at once in that case.
        install()
    from launcher.preload import exit_teardown

    exit_teardown.arm()  # before the function runs: its own exit handlers run first
    result = fn(*args)
    import pickle

    with open(result_path + ".tmp", "wb") as handle:
        pickle.dump(result, handle)
    os.replace(result_path + ".tmp", result_path)
    if channel is not None:
        _hand_over(channel)


def _hand_over(channel: multiprocessing.connection.Connection) -> None:
    """Tell the agent the result is written; return once it lets this worker go.

    The agent lets every local worker go together, once it has all their results (torchrun's
    workers wait the same way); an agent that is gone ends the wait too (its end closed).
    """
    try:
        channel.send_bytes(b"done")
        channel.recv_bytes()
    except (EOFError, OSError):
        pass
    finally:
        channel.close()


def start_function(
    local_rank: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    env: Mapping[str, str],
    stdout_fd: int,
    stderr_fd: int,
    result_path: str,
    start_method: str,
    cpus: frozenset[int] | None = None,
    parent_death_signal: bool = True,
    close_fds: tuple[int, ...] = (),
    cgroup: str | None = None,
) -> FunctionWorker:
    """Start ``fn(*args)`` in a new process whose output goes to the given pipe ends; ``cgroup``:
    the directory of a cgroup the worker moves itself into first thing."""
    import multiprocessing
    import multiprocessing.connection

    context = multiprocessing.get_context(start_method)
    # Connections pickle as duplicated descriptors, so the pipe ends reach the child whatever
    # the start method; the child moves them onto fds 1 and 2.
    out = multiprocessing.connection.Connection(os.dup(stdout_fd), readable=False)
    err = multiprocessing.connection.Connection(os.dup(stderr_fd), readable=False)
    ours, theirs = multiprocessing.connection.Pipe(duplex=True)  # "done" one way, "go" the other
    process = context.Process(  # type: ignore[attr-defined]
        target=_function_main,
        args=(fn, args, dict(env), out, err, result_path, os.getpid(), cpus, parent_death_signal,
              (*close_fds, ours.fileno()) if start_method == "fork" else (), cgroup, theirs),
        name=f"launcher-worker-{local_rank}",
    )
    try:
        process.start()
    except BaseException:
        ours.close()
        raise
    finally:
        out.close()
        err.close()
        theirs.close()
    return FunctionWorker(local_rank, process, result_path, time.time(), ours)
