"""Where the agent's cgroup v2 is, and the warm-up for its move into the job's cgroup.

The first half of the ``cgroup`` mode of :mod:`launcher.containment.containment`: finding the
directory of this process's cgroup v2 (its mount in ``/proc/self/mountinfo``, this process's
place in it in ``/proc/self/cgroup``), and paying the kernel's wait for a move into a cgroup
(an RCU grace period, 5-25 ms) while the command line still builds its plan. Creating, entering,
killing and removing the job's cgroup is :class:`~launcher.containment.containment.Containment`'s.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import sys
import time


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
    from launcher.containment.mode import requested_mode

    stop_warming()
    if requested_mode() != "auto":
        return
    origin = current_cgroup_directory()
    if origin is not None and os.access(os.path.join(origin, "cgroup.procs"), os.W_OK):
        _warmer = _Warmer(origin)


def stop_warming() -> None:
    """Stop the warm-up (if any) and wait until its last no-op move is done."""
    global _warmer
    warmer, _warmer = _warmer, None
    if warmer is not None:
        warmer.stop()


def warming_origin() -> str | None:
    """The cgroup the warm-up is moving this process into (where it already is), if it runs."""
    return _warmer.origin if _warmer is not None else None


def warming() -> bool:
    """Whether the warm-up still moves this process (a real move must wait for :func:`stop_warming`)."""
    return _warmer is not None and _warmer.running
