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
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Collection

from launcher.agent._watchdog_main import (
    cgroup_kill,
    cgroup_pids,
    cgroup_remove,
    descendants,
    move_to_cgroup,
    proc_stat,
)

log = logging.getLogger("launcher.agent")

#: ``auto`` (the default): a cgroup where one is writable, else (command line) a child subreaper;
#: ``subreaper``: never a cgroup (how the tests force the fallback); ``off``: neither.
MODE_VARIABLE = "LAUNCHER_CONTAINMENT"
MODES = ("auto", "subreaper", "off")

#: Seconds between two looks for adopted orphans while a job runs (subreaper mode).
POLL_INTERVAL = 0.25


def _unescape(field: str) -> str:
    """A mountinfo path field (spaces and the like are written as octal escapes)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup2_mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(root, mount point) of every cgroup2 mount listed in ``mountinfo`` text."""
    mounts = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        if not sep or not tail.startswith("cgroup2 "):
            continue
        fields = head.split()
        if len(fields) >= 5:
            mounts.append((_unescape(fields[3]), _unescape(fields[4])))
    return mounts


def cgroup2_path(cgroup: str) -> str | None:
    """This process's cgroup v2 path (the ``0::`` line of ``/proc/<pid>/cgroup`` text), if any."""
    for line in cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or None
    return None


def cgroup2_directory(mountinfo: str, cgroup: str) -> str | None:
    """The directory of the cgroup v2 named in ``cgroup`` text, through a mount in ``mountinfo``."""
    path = cgroup2_path(cgroup)
    if path is None or not path.startswith("/"):
        return None
    for root, mount_point in cgroup2_mounts(mountinfo):
        # A mount shows the hierarchy from ``root`` down; a path outside it is not reachable there.
        if root == "/":
            relative = path
        elif path == root or path.startswith(root.rstrip("/") + "/"):
            relative = path[len(root.rstrip("/")):]
        else:
            continue
        directory = mount_point.rstrip("/") + relative if relative != "/" else mount_point
        if os.path.isdir(directory):
            return directory
    return None


def current_cgroup_directory(pid: int | str = "self") -> str | None:
    """The directory of the cgroup v2 that process ``pid`` is in, where one is mounted."""
    try:
        cgroup = _read_text(f"/proc/{pid}/cgroup")
        if cgroup2_path(cgroup) is None:
            return None
        mountinfo = _read_text("/proc/self/mountinfo")
    except OSError:
        return None
    return cgroup2_directory(mountinfo, cgroup)


def _read_text(path: str) -> str:
    """A /proc file, read plainly (on the start-up path: no text layer)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="surrogateescape")


def requested_mode() -> str:
    value = os.environ.get(MODE_VARIABLE, "auto").strip().lower() or "auto"
    if value not in MODES:
        log.warning("%s=%s is not one of %s: using auto", MODE_VARIABLE, value, ", ".join(MODES))
        return "auto"
    return value


def own_children() -> list[int]:
    """This process's children (of every thread), zombies included."""
    children: list[int] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return children
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children", "rb") as handle:
                children.extend(int(child) for child in handle.read().split())
        except OSError:
            pass
    return children


class _Warmer:
    """Keeps moving this process into the cgroup it is already in, until stopped (2 s at most).

    A move into a cgroup first waits for an RCU grace period (5-25 ms), unless another move ended
    less than about one grace period before. These no-op moves pay it while the command line still
    builds its plan, and keep paying nothing more until the agent moves into the job's cgroup.
    """

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self._stop = _thread.allocate_lock()
        self._stop.acquire()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        fast_switching(True)
        try:
            _thread.start_new_thread(self._run, ())
        except RuntimeError:
            self._finish()

    @property
    def running(self) -> bool:
        return self._done.locked()

    def _finish(self) -> None:
        fast_switching(False)
        self._done.release()

    def _run(self) -> None:
        try:
            fd = os.open(os.path.join(self.origin, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            self._finish()
            return
        try:
            deadline = time.monotonic() + 2.0
            while True:
                os.write(fd, b"0")
                if self._stop.acquire(timeout=0.003) or time.monotonic() > deadline:
                    break
        except OSError:
            pass
        finally:
            os.close(fd)
            self._finish()

    def stop(self) -> None:
        """Stop, and wait until no more no-op move can come (it would undo the real one)."""
        with contextlib.suppress(RuntimeError):
            self._stop.release()
        self._done.acquire()
        self._done.release()


_warmer: _Warmer | None = None
_switching = [0, 0.005]  # holders of fast_switching(True), and the interval to restore
_switching_lock = _thread.allocate_lock()


def fast_switching(on: bool) -> None:
    """While a set-up thread runs: it needs the interpreter lock back after each system call, which
    the busy main thread gives up only every 5 ms by default. Calls nest (from any thread)."""
    with _switching_lock:
        if on:
            if _switching[0] == 0:
                _switching[1] = sys.getswitchinterval()
                sys.setswitchinterval(min(_switching[1], 0.0002))
            _switching[0] += 1
        elif _switching[0] > 0:
            _switching[0] -= 1
            if _switching[0] == 0:
                sys.setswitchinterval(_switching[1])


def warm_up() -> None:
    """The command line, as soon as it knows it will run a job: start paying the kernel's wait for
    the agent's move into the job's cgroup (see :class:`_Warmer`) while the plan is being built.
    Costs about 0.3 ms here; does nothing where no cgroup v2 is mounted or the mode is not auto."""
    global _warmer
    _stop_warming()
    if requested_mode() != "auto":
        return
    origin = current_cgroup_directory()
    if origin is not None and os.access(os.path.join(origin, "cgroup.procs"), os.W_OK):
        _warmer = _Warmer(origin)


def _stop_warming() -> None:
    global _warmer
    warmer, _warmer = _warmer, None
    if warmer is not None:
        warmer.stop()


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
        self._adopted: set[int] = set()  # registered with the watchdog (subreaper mode)
        self._next_poll = 0.0
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
                origin = _warmer.origin if _warmer is not None else current_cgroup_directory()
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
        if located and (_warmer is None or not _warmer.running):
            with contextlib.suppress(OSError):
                move_to_cgroup(located[1])  # where it is: only warms the kernel up for the real move
        gate = self._gate
        if gate is not None:
            gate.acquire()  # until the watchdog runs
        _stop_warming()
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
        from launcher.agent.process import set_child_subreaper

        set_child_subreaper(True)

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
        """Where a function worker moves itself first thing (the Python API's workers)."""
        return self.leaf if self.mode == "cgroup" and not self.own_process else None

    def adopt(self, pid: int) -> None:
        """Move a worker just started into the job's cgroup (the Python API; the command line's
        workers are born there)."""
        if self.mode != "cgroup" or self.own_process or self.leaf is None:
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

    def _adopted_children(self, spare: Collection[int]) -> tuple[list[int], list[int]]:
        """(live, exited) orphans this process adopted: children that are no worker, no known helper,
        and in another session than this process (what the agent starts for itself shares its
        session; a worker's descendants never do)."""
        live: list[int] = []
        exited: list[int] = []
        for pid in own_children():
            if pid in spare:
                continue
            info = proc_stat(pid)
            if info is None or info[2] == self._sid:
                continue
            (exited if info[0] in ("Z", "X") else live).append(pid)
        return live, exited

    def _reap(self, pids: Collection[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ChildProcessError, OSError):
                if os.waitpid(pid, os.WNOHANG)[0] and pid in self._adopted:
                    self._adopted.discard(pid)
                    if self._register is not None:
                        self._register(pid, False)

    @property
    def adopts(self) -> bool:
        """Whether orphans re-parent to the agent (subreaper mode, or the agent is pid 1): see :meth:`poll`."""
        return self.mode == "subreaper" or self._init

    def poll(self, spare: Collection[int]) -> None:
        """Where the agent adopts orphans, every ``POLL_INTERVAL``: reap those that exited, and register
        the others with the watchdog (which then kills them with the job if the agent dies).
        ``spare``: every worker and helper pid (their exit status belongs to someone else)."""
        if not self.adopts or self._thread is not None:
            return
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_INTERVAL
        live, exited = self._adopted_children(spare)
        self._reap(exited)
        for pid in live:
            if pid not in self._adopted:
                self._adopted.add(pid)
                if self._register is not None:
                    self._register(pid, True)
                log.debug("adopted orphan pid %d (registered with the watchdog)", pid)

    # -- stopping ------------------------------------------------------------------------------

    def _doomed(self, spare: Collection[int], helpers: Collection[int]) -> set[int]:
        me = os.getpid()
        if self.mode == "cgroup" and self.job is not None:
            doomed = set(cgroup_pids(self.job)) - {me}
            if self.own_process:
                # The agent is in the cgroup with what it starts for itself (the --preload template,
                # multiprocessing's helpers): spare those, its children that are known helpers or in
                # its own session, and what is below them short of a worker. A worker's orphan
                # adopted by the agent is neither.
                roots = []
                for pid in own_children():
                    if pid in spare:
                        continue
                    info = proc_stat(pid)
                    if pid in helpers or (info is not None and info[2] == self._sid):
                        roots.append(pid)
                doomed -= descendants(roots, stop=set(spare))
        elif self.mode == "subreaper":
            live, exited = self._adopted_children({*spare, *helpers})
            self._reap(exited)
            doomed = descendants(live, stop=set(spare))
        else:
            return set()
        doomed -= set(spare)
        return {pid for pid in doomed if (proc_stat(pid) or ("X",))[0] not in ("Z", "X")}

    def sweep(self, spare: Collection[int] = (), helpers: Collection[int] = (), timeout: float = 5.0) -> set[int]:
        """SIGKILL what the job's ended workers left (see the module docstring), until none is left;
        the pids killed. ``spare``: the workers (never killed or reaped here: their exit status is
        their handle's); ``helpers``: the agent's own processes (spared with what is below them)."""
        if self.mode == "none" or self._thread is not None:
            return set()
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doomed = self._doomed(spare, helpers)
            if not doomed:
                break
            for pid in doomed:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            killed |= doomed
            time.sleep(0.002)  # orphans of the killed re-parent once their parent is gone
        if self.mode == "subreaper":
            self._reap(killed)
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
            from launcher.agent.process import set_child_subreaper

            with contextlib.suppress(OSError, AttributeError):
                set_child_subreaper(False)
        self.mode = "none"
