"""The ``subreaper`` fallback of :mod:`launcher.containment.containment`: the orphans the agent adopts.

Where no cgroup is writable, the command line's agent is a child subreaper
(``PR_SET_CHILD_SUBREAPER``): a process orphaned below a worker (a double-forked daemon)
re-parents to the agent rather than to init. While the job runs, :meth:`Orphans.poll` reaps
the adopted orphans that exited and registers the others with the watchdog (which kills them
with the job if the agent dies); whenever a group ends, :meth:`Orphans.leftovers` says what to
kill. The agent as a container's init adopts every orphan whatever the mode, and uses the same.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Collection

from launcher.containment._watchdog_main import descendants, proc_stat

log = logging.getLogger("launcher.agent")


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


def become_subreaper() -> None:
    """Make this process a child subreaper (raises OSError, or AttributeError without ctypes' libc)."""
    from launcher.agent.process import set_child_subreaper

    set_child_subreaper(True)


def stop_being_subreaper() -> None:
    from launcher.agent.process import set_child_subreaper

    with contextlib.suppress(OSError, AttributeError):
        set_child_subreaper(False)


class Orphans:
    """The orphans this process adopted as a subreaper, and their registration with the watchdog."""

    def __init__(self, sid: int, register: Callable[[int, bool], None] | None, interval: float) -> None:
        """``sid``: the agent's session (what it starts for itself shares it; a worker's descendants
        never do). ``register(pid, True/False)`` tells the watchdog about an adopted orphan (and
        that it is gone). ``interval``: seconds between two looks while the job runs."""
        self._sid = sid
        self._register = register
        self._interval = interval
        self._adopted: set[int] = set()  # registered with the watchdog
        self._next_poll = 0.0

    def children(self, spare: Collection[int]) -> tuple[list[int], list[int]]:
        """(live, exited) orphans this process adopted: children that are no worker, no known helper,
        and in another session than this process."""
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

    def reap(self, pids: Collection[int]) -> None:
        """Collect the exit status of those of ``pids`` that exited (telling the watchdog they are gone)."""
        for pid in pids:
            with contextlib.suppress(ChildProcessError, OSError):
                if os.waitpid(pid, os.WNOHANG)[0] and pid in self._adopted:
                    self._adopted.discard(pid)
                    if self._register is not None:
                        self._register(pid, False)

    def poll(self, spare: Collection[int]) -> None:
        """At most every ``interval``: reap the orphans that exited, register the others.
        ``spare``: every worker and helper pid (their exit status belongs to someone else)."""
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + self._interval
        live, exited = self.children(spare)
        self.reap(exited)
        for pid in live:
            if pid not in self._adopted:
                self._adopted.add(pid)
                if self._register is not None:
                    self._register(pid, True)
                log.debug("adopted orphan pid %d (registered with the watchdog)", pid)

    def leftovers(self, spare: Collection[int], helpers: Collection[int]) -> set[int]:
        """What the job's ended workers left: every live adopted orphan and what is below it, short of
        a worker (``spare``); the agent's own ``helpers`` are no orphans. Reaps those that exited."""
        live, exited = self.children({*spare, *helpers})
        self.reap(exited)
        return descendants(live, stop=set(spare))
