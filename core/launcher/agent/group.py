"""The local worker group: starting every local worker, watching them, stopping them.

A group lives for one attempt. It builds each worker's output routes from the LogsSpecs'
destinations, starts the processes, registers them with the watchdog, and reports exits the
moment they happen. Stopping sends a signal to every worker's process group, waits up to the
shutdown timeout (cut short by :meth:`WorkerGroup.hurry`), then SIGKILLs whatever is left. Once the
workers have ended, a sweep kills every process still carrying the job's token in its environment,
then every process the job's containment holds (its cgroup, or the orphans the agent adopted as a
child subreaper: ``containment.py``): whatever the workers started, at any depth, in any session
and with any environment (double-forked daemons that cleared it included).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from string import Template
from typing import TYPE_CHECKING, Any, BinaryIO

from launcher.agent.process import FunctionWorker, WorkerProcess, is_stopped, start_command, start_function
from launcher.containment._watchdog_main import descendants, job_processes
from launcher.containment.containment import POLL_INTERVAL
from launcher.containment.watchdog import Watchdog, job_env
from launcher.logs.pump import OutputPump, StreamRoute, open_log
from launcher.logs.specs import CONSOLE
from launcher.logs.terminal import WorkerTerminals, stream_wants_terminal

if TYPE_CHECKING:  # pragma: no cover
    from launcher.plugins.types import LogsDestinations
    from launcher.preload.preload import Preloader

log = logging.getLogger("launcher.agent")


@dataclass
class WorkerSlot:
    """One local worker of an attempt: what it is, and its process once started."""

    local_rank: int
    global_rank: int
    role_rank: int
    env: dict[str, str]
    process: WorkerProcess | None = None
    streams: list[Any] = field(default_factory=list)
    stderr_stream: Any = None
    error_file: str | None = None
    #: Called whenever the worker writes output (hang watching by output), set before it starts.
    on_output: Callable[[], None] | None = None


@dataclass
class _Delivery:
    """Selector data: this function worker's channel (its result is written, or it ended)."""

    slot: WorkerSlot


@dataclass
class _Launch:
    """How :meth:`WorkerGroup.start` started the workers: kept to start a slot again the same way."""

    entry: Entrypoint
    dest: LogsDestinations
    role: str
    prefix_template: str | None
    stdout_filters: Sequence[str]
    stderr_filters: Sequence[str]
    cpus: Sequence[frozenset[int] | None] | None
    start_method: str
    result_dir: str
    worker_tty: str
    guarded: bool
    always_prefix: bool
    filtered_out: BinaryIO | None
    filtered_err: BinaryIO | None


@dataclass
class Entrypoint:
    """What every worker runs: a command (argv) or a Python callable with arguments."""

    command: list[str] | None = None
    function: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()

    @property
    def name(self) -> str:
        if self.command is not None:
            return os.path.basename(self.command[0]) if self.command else ""
        return getattr(self.function, "__qualname__", repr(self.function))


def substitute_local_rank(argv: Sequence[str], local_rank: int) -> list[str]:
    """torchrun's ``${local_rank}`` macro in worker arguments."""
    return [arg.replace("${local_rank}", str(local_rank)) for arg in argv]


def console_prefix(template: str | None, role: str, rank: int, local_rank: int, always: bool) -> bytes:
    if template:
        text = Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank)
        return text.encode()
    return f"[{role}{local_rank}]:".encode() if always else b""


class WorkerGroup:
    """The workers of one attempt on this node."""

    def __init__(self, slots: list[WorkerSlot], pump: OutputPump, watchdog: Watchdog,
                 wakeup_fd: int | None = None) -> None:
        """``wakeup_fd``, when given, is readable when :meth:`wait` should return early (a signal)."""
        self.slots = slots
        self._pump = pump
        self._watchdog = watchdog
        self._containment = watchdog.containment
        self._selector = selectors.DefaultSelector()
        self._wakeup_fd = wakeup_fd
        if wakeup_fd is not None:
            self._selector.register(wakeup_fd, selectors.EVENT_READ, None)
        self._files: list[BinaryIO] = []
        self._polled: list[WorkerSlot] = []  # workers without an exit descriptor
        self._hurry = False
        self._swept = False  # a stop swept after every worker ended: close need not scan again
        self._terminals = WorkerTerminals()
        #: --preload's template, when this attempt's workers are forked from it (the sweep spares it).
        self._preload: Preloader | None = None
        self._launch: _Launch | None = None

    # -- starting ----------------------------------------------------------------------------

    def start(
        self,
        entry: Entrypoint,
        dest: LogsDestinations,
        *,
        role: str,
        prefix_template: str | None,
        stdout_filters: Sequence[str],
        stderr_filters: Sequence[str],
        cpus: Sequence[frozenset[int] | None] | None,
        start_method: str,
        result_dir: str,
        worker_tty: str = "never",
        preload: Preloader | None = None,
    ) -> None:
        """Start every worker; ``dest`` is the LogsSpecs' LogsDest for this attempt.

        ``worker_tty`` (``auto``, ``always``, ``never``) says which streams are pseudo-terminals
        rather than pipes (:mod:`launcher.logs.terminal`). ``preload`` (``--preload``) forks
        command workers from its template when it can.
        """
        guarded = self._watchdog.running
        # From here on the agent is in the job's cgroup (or a subreaper): what it starts is contained.
        self._containment.settle()
        if preload is not None and entry.command is not None and preload.prepare(  # --preload
                [job_env(slot.env, self._watchdog.token) for slot in self.slots], self._wakeup_fd):
            self._preload = preload
        tee_any = bool(dest.tee_stdouts) or bool(dest.tee_stderrs)
        self._launch = _Launch(entry, dest, role, prefix_template, stdout_filters, stderr_filters, cpus,
                               start_method, result_dir, worker_tty, guarded, len(self.slots) > 1 or tee_any,
                               self._open_filtered(dest.filtered_stdout, stdout_filters),
                               self._open_filtered(dest.filtered_stderr, stderr_filters))
        for slot in self.slots:
            self._start_slot(slot, self._launch, self._preload)

    def respawn(self, slots: Sequence[WorkerSlot]) -> None:
        """Start a fresh process in each of ``slots``, whose process has ended (recovery in place:
        the group's other workers keep theirs). Same routes and options as :meth:`start`."""
        assert self._launch is not None, "respawn() before start()"
        preload = self._preload  # --preload: forked from the template, which has torch already
        if preload is not None and slots and not preload.prepare(
                [job_env(slot.env, self._watchdog.token) for slot in self.slots], self._wakeup_fd):
            preload = None
        for slot in slots:
            old = slot.process
            if old is not None:
                self._watchdog.forget(old.pid)
                if slot in self._polled:
                    self._polled.remove(slot)
                old.signal_group(signal.SIGKILL)  # what it left behind in its process group
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._selector.unregister(old.fileno())
                old.close()
            slot.process = None
            self._start_slot(slot, self._launch, preload)

    def add_wakeup(self, fd: int) -> None:
        """Make :meth:`wait` return early when ``fd`` is readable too (it reads what is there)."""
        if fd not in self._selector.get_map():
            self._selector.register(fd, selectors.EVENT_READ, None)

    def _start_slot(self, slot: WorkerSlot, launch: _Launch, preload: Preloader | None) -> None:
        entry, dest, rank = launch.entry, launch.dest, slot.local_rank
        close_fds = (self._watchdog.pipe_fd,) if self._watchdog.pipe_fd is not None else ()
        prefix = console_prefix(launch.prefix_template, launch.role, slot.global_rank, rank, launch.always_prefix)
        out_route = self._route(dest.stdouts.get(rank, CONSOLE), rank in dest.tee_stdouts, 1, prefix,
                                launch.stdout_filters, launch.filtered_out)
        err_route = self._route(dest.stderrs.get(rank, CONSOLE), rank in dest.tee_stderrs, 2, prefix,
                                launch.stderr_filters, launch.filtered_err)
        err_route.keep_tail = True
        out_route.on_output = err_route.on_output = slot.on_output
        slot.error_file = dest.error_files.get(rank) or None
        out_r, out_w = self._channel(out_route, launch.worker_tty)
        try:
            err_r, err_w = self._channel(err_route, launch.worker_tty)
        except BaseException:
            os.close(out_r)
            os.close(out_w)
            raise
        worker_cpus = launch.cpus[rank] if launch.cpus else None
        guarded = launch.guarded
        # The token lets the stop-time sweep and the watchdog find every process of the job,
        # whatever its parent or session, without any registration (so no start-up window).
        env = job_env(slot.env, self._watchdog.token)
        try:
            if entry.command is not None:
                argv = substitute_local_rank(entry.command, rank)
                slot.process = None if preload is None else preload.start_worker(
                    rank, argv, env, out_w, err_w, worker_cpus, parent_death_signal=not guarded)
                if slot.process is None:
                    slot.process = start_command(rank, argv, env, out_w, err_w, worker_cpus,
                                                 parent_death_signal=not guarded,
                                                 cgroup=self._containment.worker_cgroup)
            else:
                assert entry.function is not None
                slot.process = start_function(
                    rank, entry.function, entry.args, env, out_w, err_w,
                    os.path.join(launch.result_dir, f"result_{rank}.pickle"), launch.start_method, worker_cpus,
                    parent_death_signal=not guarded, close_fds=close_fds,
                    cgroup=self._containment.worker_cgroup,
                )
        except BaseException:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        os.close(out_w)
        os.close(err_w)
        if entry.command is not None:  # the Python API's, if it could not move itself (a no-op otherwise)
            self._containment.adopt(slot.process.pid)
        slot.streams = [self._pump.add(out_r, out_route), self._pump.add(err_r, err_route)]
        slot.stderr_stream = slot.streams[1]
        self._terminals.attach(slot.process.pid)
        self._watchdog.watch(slot.process.pid)
        if getattr(slot.process, "has_exit_fd", False):
            self._selector.register(slot.process.fileno(), selectors.EVENT_READ, slot)
        else:
            self._polled.append(slot)
        if isinstance(slot.process, FunctionWorker):  # its word that the result is written
            self._selector.register(slot.process.channel_fd(), selectors.EVENT_READ, _Delivery(slot))

    def _channel(self, route: StreamRoute, worker_tty: str) -> tuple[int, int]:
        """The (read, write) ends a worker stream goes through: a pipe, or a pty (master, slave)."""
        if not stream_wants_terminal(worker_tty, route.console_fd):
            return os.pipe()
        # Shown as it comes only on a terminal console; a pipe or file console keeps whole lines.
        live = route.console_fd is not None and os.isatty(route.console_fd)
        try:
            ends = self._terminals.open(route.prefix if live else b"")
        except OSError as exc:  # out of ptys (kernel.pty.max): output still flows, plainly
            log.warning("no pseudo-terminal for a worker (%s); using a pipe", exc)
            return os.pipe()
        route.live = live
        return ends

    def _open_filtered(self, path: str, filters: Sequence[str]) -> BinaryIO | None:
        if not filters or not path or path == os.devnull:
            return None
        handle = open_log(path)
        self._files.append(handle)
        return handle

    def _route(self, target: str, tee: bool, console: int, prefix: bytes, filters: Sequence[str],
               filtered: BinaryIO | None) -> StreamRoute:
        route = StreamRoute(prefix=prefix, filters=[f.encode() for f in filters], filtered_file=filtered)
        if target == CONSOLE:
            route.console_fd = console
        elif target != os.devnull:
            route.file = open_log(target)
            self._files.append(route.file)
            if tee:
                route.console_fd = console
        return route

    # -- watching ----------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        return [slot.process.pid for slot in self.slots if slot.process is not None]

    def running(self) -> list[WorkerSlot]:
        return [s for s in self.slots if s.process is not None and s.process.poll() is None]

    def wait(self, timeout: float) -> list[WorkerSlot]:
        """Block up to ``timeout`` seconds for worker exits; the workers that ended, if any."""
        if self._containment.adopts:  # look for adopted orphans at least this often (containment.poll)
            timeout = min(timeout, POLL_INTERVAL)
        poll_interval = 0.05 if self._polled else timeout
        ready = self._selector.select(min(timeout, poll_interval)) if self._selector.get_map() else []
        if not self._selector.get_map() and not self._polled:
            time.sleep(timeout)
        ended = []
        for key, _ in ready:
            if key.data is None:  # woken up: let the caller look at why
                with contextlib.suppress(BlockingIOError, OSError):
                    os.read(key.fd, 512)
                continue
            if isinstance(key.data, _Delivery):
                self._selector.unregister(key.fd)
                self._take_result(key.data.slot)
                continue
            slot: WorkerSlot = key.data
            if slot.process is not None and slot.process.poll() is not None:
                self._selector.unregister(key.fd)
                ended.append(slot)
        for slot in list(self._polled):
            if slot.process is not None and slot.process.poll() is not None:
                self._polled.remove(slot)
                ended.append(slot)
        if self._containment.adopts:  # a child subreaper: orphans it adopted
            self._containment.poll({*self._worker_pids(), *self._helpers()})
        return ended

    def _take_result(self, slot: WorkerSlot) -> None:
        """Take a function worker's result; once every local worker's is taken, let them all exit.

        As under torchrun, no worker leaves before its local peers have finished their code too:
        a peer still inside a collective never sees this one's connections close under it.
        """
        assert isinstance(slot.process, FunctionWorker)
        if not slot.process.take_result():
            return  # it ended without one: its exit is the news (a failure stops the others)
        if all(isinstance(s.process, FunctionWorker) and s.process.delivered for s in self.slots):
            for other in self.slots:
                assert isinstance(other.process, FunctionWorker)
                other.process.release()

    def _worker_pids(self) -> set[int]:
        return {slot.process.pid for slot in self.slots if slot.process is not None}

    def _helpers(self) -> set[int]:
        """The agent's own processes that sweeps spare: the watchdog and the --preload template."""
        return {pid for pid in (self._watchdog.pid, self._preload and self._preload.pid) if pid}

    def return_values(self) -> dict[int, Any]:
        """What each function worker returned, by global rank (command workers return nothing)."""
        values: dict[int, Any] = {}
        for slot in self.slots:
            result = getattr(slot.process, "result", None)
            if result is not None:
                values[slot.global_rank] = result()
        return values

    def all_done(self) -> bool:
        return all(s.process is not None and s.process.poll() is not None for s in self.slots)

    def drain_output(self, slots: Sequence[WorkerSlot], timeout: float = 2.0) -> None:
        """Wait (bounded) until the given workers' output has all been routed."""
        streams = [stream for slot in slots for stream in slot.streams]
        if not self._pump.wait(streams, timeout):
            log.debug("output of some workers still open after %.1fs (a child holds the pipe)", timeout)

    def stderr_tail(self, slot: WorkerSlot, lines: int = 20) -> list[str]:
        return self._pump.tail(slot.stderr_stream, lines) if slot.stderr_stream is not None else []

    # -- stopping ----------------------------------------------------------------------------

    def hurry(self) -> None:
        """Skip what is left of the grace period of a :meth:`stop` (a second Ctrl-C or SIGTERM)."""
        self._hurry = True

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Signal every running worker's group, wait up to ``timeout``, then SIGKILL the rest."""
        alive = self.running()
        # Note every process of the workers' trees now, while parent links still lead to them:
        # a descendant that left its worker's session would otherwise be lost once it is orphaned.
        tree = descendants([slot.process.pid for slot in alive if slot.process is not None])
        if alive:
            log.info("stopping %d worker(s) with %s", len(alive), signal.Signals(signum).name)
            for slot in alive:
                assert slot.process is not None
                process = slot.process
                if process.hung and signum != signal.SIGKILL:
                    # Judged hung, its stacks already taken: a grace period would only be waited
                    # out (a stopped process cannot even act on SIGTERM).
                    process.was_stopped = is_stopped(process.pid)
                    log.warning("worker local rank %d (pid %d) is hung%s: killing it now", slot.local_rank,
                                process.pid, " and stopped (state T)" if process.was_stopped else "")
                    process.stop_signal = signal.SIGKILL
                    process.signal_group(signal.SIGKILL)
                    continue
                process.stop_signal = signum
                process.signal_group(signum)
                if signum != signal.SIGKILL:
                    self._continue_stopped(slot)
            deadline = time.monotonic() + timeout
            while self.running() and time.monotonic() < deadline and not self._hurry:
                self.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            for slot in self.running():
                assert slot.process is not None
                if self._hurry:
                    log.warning("worker local rank %d (pid %d): killing it now (signal received again)",
                                slot.local_rank, slot.process.pid)
                else:
                    log.warning("worker local rank %d (pid %d) did not exit within %.0fs of %s; killing it",
                                slot.local_rank, slot.process.pid, timeout, signal.Signals(signum).name)
                slot.process.stop_signal = signal.SIGKILL
                slot.process.signal_group(signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while self.running() and time.monotonic() < deadline:
                self.wait(0.02)
        self.reap_leftovers()
        self._swept = not self.running()
        for pid in tree - set(self.pids):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def mark_hung(self, local_ranks: Collection[int]) -> None:
        """The workers of ``local_ranks`` are hung (their stacks are taken): the next
        :meth:`stop` SIGKILLs them at once instead of giving them its grace period."""
        for slot in self.slots:
            if slot.local_rank in local_ranks and slot.process is not None and slot.process.poll() is None:
                slot.process.hung = True

    def kill_stopped_hung(self, timeout: float = 5.0) -> list[WorkerSlot]:
        """SIGKILL the workers judged hung (:meth:`mark_hung`) that are stopped (state T), and wait
        (up to ``timeout`` seconds) until they are reaped; their slots. A stopped process cannot
        leave its function for a recovery in place, nor act on anything but SIGKILL: its slot is
        given a fresh process instead of waiting out ``--recovery-timeout``."""
        killed = []
        for slot in self.slots:
            process = slot.process
            if process is None or not process.hung or process.poll() is not None or not is_stopped(process.pid):
                continue
            log.warning("worker local rank %d (pid %d) is hung and stopped (state T): killing it now, "
                        "a fresh process takes its slot", slot.local_rank, process.pid)
            process.was_stopped = True
            process.stop_signal = signal.SIGKILL
            process.signal_group(signal.SIGKILL)
            killed.append(slot)
        deadline = time.monotonic() + timeout
        while any(s.process is not None and s.process.poll() is None for s in killed) and time.monotonic() < deadline:
            self.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        return killed

    def _continue_stopped(self, slot: WorkerSlot) -> None:
        """SIGCONT the processes of a worker just told to stop that are stopped (state T: SIGSTOP,
        a ^Z), so that they act on the signal now rather than be waited for the whole grace."""
        process = slot.process
        assert process is not None
        stopped = sorted(pid for pid in descendants([process.pid]) if is_stopped(pid))
        if not stopped:
            return
        if process.pid in stopped:
            process.was_stopped = True
        log.info("worker local rank %d (pid %d): continuing stopped process(es) %s so that they can stop",
                 slot.local_rank, process.pid, ", ".join(map(str, stopped)))
        process.signal_group(signal.SIGCONT)
        for pid in stopped:  # those that left the worker's process group too
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)

    def reap_leftovers(self, sweep: bool = True) -> None:
        """Kill what exited workers left behind, in their process groups and (``sweep``) anywhere else."""
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is not None and slot.process.signal_group(
                signal.SIGKILL
            ):
                log.info("killed processes left behind by worker local rank %d (pid %d)",
                         slot.local_rank, slot.process.pid)
        if sweep:
            self.sweep()

    def sweep(self, timeout: float = 5.0) -> int:
        """SIGKILL every process of the job but running workers and the agent's helpers; how many
        were killed.

        First by token: one scan of ``/proc/*/environ`` when nothing is left (at stop time only,
        never on the start-up path), repeated while it finds something, since a process can fork
        while its parent is being killed. Then by containment: the job's cgroup (read from its
        ``cgroup.procs``) or the orphans the agent adopted, which also finds what cleared its
        environment.
        """
        exclude = {os.getpid(), *self._helpers()}
        exclude.update(slot.process.pid for slot in self.running() if slot.process is not None)
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doomed = job_processes(self._watchdog.token, exclude)
            if not doomed:
                break
            for pid in doomed:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            killed.update(doomed)
            time.sleep(0.005)
        killed |= self._containment.sweep(spare=self._worker_pids(), helpers=self._helpers(), timeout=timeout)
        if killed:
            log.info("killed %d process(es) the workers left behind (pids %s)", len(killed),
                     ", ".join(map(str, sorted(killed))))
        return len(killed)

    def close(self) -> None:
        """Release descriptors and files once every worker has ended."""
        self.reap_leftovers(sweep=not self._swept)
        self.drain_output(self.slots, timeout=2.0)
        for slot in self.slots:
            if slot.process is not None:
                self._watchdog.forget(slot.process.pid)
                slot.process.close()
        self._terminals.close()
        self._selector.close()
        for handle in self._files:
            with contextlib.suppress(ValueError, OSError):
                handle.close()
        self._files.clear()
