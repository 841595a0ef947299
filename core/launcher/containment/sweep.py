"""The sweep of :mod:`launcher.containment.containment`: what a job's ended workers left, SIGKILLed until none is left.

Run whenever a worker group ends (and at the end of the job in ``subreaper`` mode). What is
left is, in ``cgroup`` mode, every process of the job's cgroup but the agent, its own helpers
and the workers; in ``subreaper`` mode, the orphans the agent adopted
(:meth:`~launcher.containment.orphans.Orphans.leftovers`). Killing a process may orphan its children,
which re-parent (to the agent, or stay in the cgroup) a moment later: the sweep looks again
until it finds nothing, or its time is up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Collection

from launcher.containment._watchdog_main import cgroup_pids, descendants, proc_stat
from launcher.containment.orphans import own_children


def cgroup_leftovers(job: str, own_process: bool, sid: int, spare: Collection[int],
                     helpers: Collection[int]) -> set[int]:
    """The processes of the job's cgroup ``job`` that the ended workers left.

    ``own_process``: the agent is in the cgroup with what it starts for itself (the --preload
    template, multiprocessing's helpers): spare those, its children that are known ``helpers``
    or in its own session ``sid``, and what is below them short of a worker. A worker's orphan
    adopted by the agent is neither.
    """
    doomed = set(cgroup_pids(job)) - {os.getpid()}
    if own_process:
        roots = []
        for pid in own_children():
            if pid in spare:
                continue
            info = proc_stat(pid)
            if pid in helpers or (info is not None and info[2] == sid):
                roots.append(pid)
        doomed -= descendants(roots, stop=set(spare))
    return doomed


def kill_until_none(find: Callable[[], set[int]], spare: Collection[int], timeout: float) -> set[int]:
    """SIGKILL what ``find()`` returns (never a pid of ``spare``, never a zombie), again and again
    until it finds nothing or ``timeout`` seconds passed; the pids killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doomed = {pid for pid in find() - set(spare) if (proc_stat(pid) or ("X",))[0] not in ("Z", "X")}
        if not doomed:
            break
        for pid in doomed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed |= doomed
        time.sleep(0.002)  # orphans of the killed re-parent once their parent is gone
    return killed
