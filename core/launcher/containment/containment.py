"""Containment: every process a job starts ends with the job, whatever its session or environment.

The job token (``LAUNCHER_JOB_TOKEN``, see ``watchdog.py``) finds the processes that kept the
workers' environment; a process that clears it and leaves its worker's session and tree is found
only by what this module sets up, once per agent, in the first mode that works:

``cgroup``
    Where a cgroup v2 hierarchy is writable (its mount found in ``/proc/self/mountinfo``, this
    process's place in it in ``/proc/self/cgroup``), the job gets ``<agent's cgroup>/launcher-<token>``
    with one leaf, ``workers``. The command line's agent moves *itself* into the leaf before it
    starts any worker (on a thread, started before the watchdog: the first move of a process waits
    for an RCU grace period, 5-25 ms, which the rest of the start-up hides), so every worker and
    everything below it is in the leaf from birth: no race, no pre-exec function (workers keep
    starting with vfork). What the workers left is killed whenever a group ends (every process of
    the leaf but the agent and its own helpers), and at the end of the job the agent moves back to
    its cgroup, kills the job's (``cgroup.kill``; before Linux 5.14, freeze and SIGKILL each
    process), waits until it is empty and removes it. If the agent dies without that, the watchdog
    (outside the cgroup) kills and removes it.
``subreaper``
    The command line only, where no cgroup is writable (or ``LAUNCHER_CONTAINMENT=subreaper``): the
    agent is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a process orphaned below a worker
    (a double-forked daemon) re-parents to the agent rather than to init. Whenever a group ends the
    agent kills every orphan it adopted and everything below it, until none is left; while the job
    runs it reaps the ones that exit and registers the others with the watchdog (looked for every
    ``POLL_INTERVAL``). Gap: when the agent is SIGKILLed, an orphan adopted since its last look (or
    one adopted by another subreaper between the worker and the agent) that dropped the token and
    left its worker's session survives.
``none``
    Neither (``LAUNCHER_CONTAINMENT=off``, or the Python API without a writable cgroup): the token,
    the workers' sessions and process trees, and the watchdog, as described in
    ``docs/architecture.md``.

The Python API (``launcher.launch()``) runs the agent in the user's process, which is never moved
and never made a subreaper (that would adopt, and at the end kill, orphans of the user's own
children). With a writable cgroup its workers are moved into the leaf right after they start (a
function worker moves itself first thing, before it runs anything); what a command worker starts
in the microseconds between its exec and that move is still covered by the token.

This module chooses the mode and sets it up, and creates, enters, kills and removes the job's
cgroup; where the cgroup is found and the warm-up for the move are in :mod:`launcher.containment.cgroups`,
the subreaper's adopted orphans in :mod:`launcher.containment.orphans` (loaded only in that mode), and
the kill of what ended workers left in :mod:`launcher.containment.sweep` (loaded when a group ends).
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from launcher.containment._watchdog_main import cgroup_kill, cgroup_remove, move_to_cgroup
from launcher.containment.cgroups import current_cgroup_directory, fast_switching, stop_warming, warming, warming_origin
from launcher.containment.mode import requested_mode

if TYPE_CHECKING:  # pragma: no cover
    from launcher.containment.orphans import Orphans

log = logging.getLogger("launcher.agent")

#: Seconds between two looks for adopted orphans while a job runs (subreaper mode).
POLL_INTERVAL = 0.25


class Containment:
    """The containment of one agent's job (see the module docstring)."""

    def __init__(self, token: str, own_process: bool,
                 register: Callable[[int, bool], None] | None = None) -> None:
        """``own_process``: the agent owns this process (the command line), so it may move it and
        make it a subreaper. ``register(pid, True/False)`` tells the watchdog about an adopted
        orphan (and that it is gone)."""
        self.token = token
        self.own_process = own_process
        self._register = register
        #: ``cgroup``, ``subreaper`` or ``none``: set on the set-up thread, to be read after :meth:`settle`.
        self.mode = "none"
        #: The job's cgroup directory, its workers' leaf, and the agent's own cgroup (cgroup mode).
        self.job: str | None = None
        self.leaf: str | None = None
        self.origin: str | None = None
        self._inside = False  # the agent is in the leaf
        #: Held while the set-up thread runs (:meth:`settle` waits for it).
        self._thread: _thread.LockType | None = None
        self._notes: list[tuple[int, str]] = []  # what the set-up thread has to say (settle says it)
        self._mode_requested: str | None = None
        self._orphans: Orphans | None = None  # made when the agent adopts orphans (subreaper mode, init)
        self._sid = os.getsid(0)
        #: The agent as a container's init adopts every orphan, whatever the mode: it reaps them too.
        self._init = own_process and os.getpid() == 1
        self._prepared = False
        self._located: list[str] | None = None
        #: Held until the watchdog runs: the set-up thread creates no cgroup before.
        self._gate: _thread.LockType | None = _thread.allocate_lock()
        self._gate.acquire()
        self._deferred: Callable[[], None] | None = None
        self._switching = False
        #: Seconds the first worker waited in :meth:`settle` for the agent's move (measured).
        self.settle_wait = 0.0

    # -- setting up ----------------------------------------------------------------------------

    def locate(self) -> list[str]:
        """Find where the job's cgroup would go; what the watchdog needs to kill it (its directory
        and the agent's cgroup), or nothing. Called before the watchdog starts, which is before
        the cgroup exists: an agent killed at any moment from here on leaves nothing behind."""
        if self._located is None:
            self._located = []
            if self._requested() == "auto":
                origin = warming_origin() or current_cgroup_directory()
                if origin is not None:
                    self._located = [os.path.join(origin, f"launcher-{self.token}"), origin]
        return self._located

    def _requested(self) -> str:
        if self._mode_requested is None:
            self._mode_requested = requested_mode()
        return self._mode_requested

    def prepare(self) -> None:
        """Start setting the mode up, before the watchdog starts (:meth:`watchdog_started` goes on).

        Everything runs on a thread until :meth:`settle`, since any of it can take milliseconds.
        Moving a process into a cgroup waits for an RCU grace period (5-25 ms) unless another move
        happened a moment before; creating a cgroup waits for the kernel's cgroup lock, which any
        move on the machine holds that long; the subreaper call imports ctypes. So the thread first
        "moves" the agent into the cgroup it is in (a no-op that pays the grace period while the
        watchdog starts), and creates the job's cgroup and moves into it only once the watchdog
        runs (an agent killed before leaves no cgroup; one killed after, the watchdog removes).
        """
        if self._prepared:
            return
        self._prepared = True
        if self._requested() == "off" or not (self.locate() or self.own_process):
            self._gate = None
            return
        if self.own_process:
            fast_switching(True)  # until settle()
            self._switching = True
        self._start(self._setup)

    def watchdog_started(self) -> None:
        """The watchdog runs (or could not be started): the job's cgroup may be created now."""
        self.prepare()
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.release()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            deferred()

    def _setup(self) -> None:
        """On the set-up thread: the first mode that works. What to say is kept for :meth:`settle`."""
        located = self.locate()
        if located and not warming():
            with contextlib.suppress(OSError):
                move_to_cgroup(located[1])  # where it is: only warms the kernel up for the real move
        gate = self._gate
        if gate is not None:
            gate.acquire()  # until the watchdog runs
        stop_warming()
        if located and self._make_cgroup():
            assert self.leaf is not None
            if not self.own_process:
                self.mode = "cgroup"
                return
            try:
                move_to_cgroup(self.leaf)
                self._inside = True
                self.mode = "cgroup"
                return
            except OSError as exc:
                self._notes.append((logging.INFO, f"cannot move into the job's cgroup {self.leaf} ({exc.strerror}): "
                                                  "using a child subreaper"))
                self._drop_cgroup()
        if self.own_process:
            try:
                self._become_subreaper()
                self.mode = "subreaper"
            except (OSError, AttributeError) as exc:
                self._notes.append((logging.WARNING, f"cannot contain the job's processes ({exc}): those that "
                                                     "leave the workers' sessions and environment may outlive it"))

    def _make_cgroup(self) -> bool:
        job, origin = self.locate()
        leaf = os.path.join(job, "workers")
        for directory in (job, leaf):
            try:
                os.mkdir(directory)
            except OSError as exc:
                self._notes.append((logging.DEBUG, f"no cgroup for the job: cannot create {directory} "
                                                   f"({exc.strerror})"))
                if directory is leaf:
                    cgroup_remove(job)
                return False
        self.origin, self.job, self.leaf = origin, job, leaf
        return True

    def _start(self, target: Callable[[], None]) -> None:
        # A bare thread: threading.Thread.start() waits until the thread runs, which on a busy
        # machine (the watchdog's interpreter starting beside us) can take milliseconds.
        done = _thread.allocate_lock()
        done.acquire()

        def run() -> None:
            try:
                target()
            except BaseException as exc:  # reported by settle()
                self._notes.append((logging.WARNING, f"cannot contain the job's processes ({exc!r})"))
            finally:
                done.release()

        self._thread = done
        try:
            _thread.start_new_thread(run, ())
        except RuntimeError:  # no thread to be had (a thread limit): done here, once the watchdog runs
            self._deferred = run

    def _become_subreaper(self) -> None:
        from launcher.containment.orphans import become_subreaper

        become_subreaper()

    def settle(self) -> None:
        """Wait until the mode is in place: before the first worker (or ``--preload`` template) starts."""
        self.watchdog_started()  # (if nobody said so: an agent without a watchdog)
        if self._thread is None:
            return
        started = time.perf_counter()
        self._thread.acquire()
        self._thread = None
        if self._switching:
            fast_switching(False)
            self._switching = False
        self.settle_wait = time.perf_counter() - started
        for level, message in self._notes:
            log.log(level, "%s", message)
        self._notes.clear()
        log.debug("containment: %s (%s); the first worker waited %.2f ms for it", self.mode,
                  self.leaf or ("child subreaper" if self.mode == "subreaper" else "token and sessions only"),
                  self.settle_wait * 1e3)

    def _drop_cgroup(self) -> None:
        if self.job is not None:
            cgroup_remove(self.job)
        self.job = self.leaf = self.origin = None

    @property
    def worker_cgroup(self) -> str | None:
        """Where a Python API's worker moves itself first thing (a function), or before its exec (a command)."""
        return self.leaf if self.mode == "cgroup" and not self.own_process else None

    def adopt(self, pid: int) -> None:
        """Move a worker just started into the job's cgroup, unless it moved itself there before
        its exec (the Python API; the command line's workers are born there)."""
        if self.mode != "cgroup" or self.own_process or self.leaf is None:
            return
        if current_cgroup_directory(pid) == self.leaf:
            return
        try:
            move_to_cgroup(self.leaf, pid)
        except ProcessLookupError:
            pass  # it ended already
        except OSError as exc:
            log.warning("cannot move worker pid %d into the job's cgroup %s (%s): its descendants that leave "
                        "its session and environment may outlive the job", pid, self.leaf, exc.strerror)
            self.mode = "none"  # the job's cgroup is still killed and removed at the end

    # -- while the job runs ------------------------------------------------------------------------

    def _adopted(self) -> Orphans:
        if self._orphans is None:
            from launcher.containment.orphans import Orphans

            self._orphans = Orphans(self._sid, self._register, POLL_INTERVAL)
        return self._orphans

    @property
    def adopts(self) -> bool:
        """Whether orphans re-parent to the agent (subreaper mode, or the agent is pid 1): see :meth:`poll`."""
        return self.mode == "subreaper" or self._init

    def poll(self, spare: Collection[int]) -> None:
        """Where the agent adopts orphans, every ``POLL_INTERVAL``: reap those that exited, and register
        the others with the watchdog (which then kills them with the job if the agent dies).
        ``spare``: every worker and helper pid (their exit status belongs to someone else)."""
        if self.adopts and self._thread is None:
            self._adopted().poll(spare)

    # -- stopping ------------------------------------------------------------------------------

    def sweep(self, spare: Collection[int] = (), helpers: Collection[int] = (), timeout: float = 5.0) -> set[int]:
        """SIGKILL what the job's ended workers left (see :mod:`launcher.containment.sweep`), until none is
        left; the pids killed. ``spare``: the workers (never killed or reaped here: their exit status
        is their handle's); ``helpers``: the agent's own processes (spared with what is below them)."""
        if self.mode == "none" or self._thread is not None:
            return set()
        from launcher.containment.sweep import cgroup_leftovers, kill_until_none

        if self.mode == "cgroup" and self.job is not None:
            job = self.job
            return kill_until_none(lambda: cgroup_leftovers(job, self.own_process, self._sid, spare, helpers),
                                   spare, timeout)
        if self.mode != "subreaper":
            return set()
        orphans = self._adopted()
        killed = kill_until_none(lambda: orphans.leftovers(spare, helpers), spare, timeout)
        orphans.reap(killed)
        return killed

    def close(self, helpers: Collection[int] = ()) -> None:
        """The job is over: kill and remove its cgroup, or its adopted orphans; stop being a subreaper."""
        with contextlib.suppress(Exception):
            self.settle()
        if self.job is not None:
            job = self.job
            if self._inside:
                assert self.origin is not None
                try:
                    move_to_cgroup(self.origin)
                    self._inside = False
                except OSError as exc:
                    log.warning("cannot move back to cgroup %s (%s): the job's cgroup %s stays behind",
                                self.origin, exc.strerror, job)
            # Inside still, it kills every other process one by one.
            if not cgroup_kill(job):
                log.warning("processes of the job's cgroup %s did not die within 10s", job)
            if not self._inside:
                cgroup_remove(job)
            self.job = self.leaf = None
        elif self.mode == "subreaper":
            killed = self.sweep(helpers=helpers)
            if killed:
                log.info("killed %d orphan(s) of the job (pids %s)", len(killed), ", ".join(map(str, sorted(killed))))
            from launcher.containment.orphans import stop_being_subreaper

            stop_being_subreaper()
        self.mode = "none"
