"""The worker's side of the step record that ``--max-no-progress-restarts`` judges by.

``launcher.heartbeat(step)`` hands every step to :func:`record_step`, loaded at the first step
given. It keeps the highest step this process has reached in a 16-byte file of its own,
``<pid>``, in the agent's step directory, mapped into memory: a step that is not higher than the
last one costs one comparison, a higher one a store into the mapped page; no system call either
way. The agent reads the directory only when a round forms after a restart
(:mod:`launcher.agent.progress`).

The directory is found without a variable of its own (a plain torchrun command line gives the
workers exactly torchrun's environment, plus the job's token): it is named after the token of
the agent that started this process, in ``/dev/shm`` or else the temporary directory
(:func:`step_dirs`). The agent makes it after the first workers started, so a worker whose first
step comes earlier looks again every :data:`RETRY_INTERVAL` seconds; without it (the tracker is
off, or the job does not run under launcher) every call after the first is a comparison and
a clock read.

File layout (little-endian): ``int64`` the highest step, ``int64`` 1 once written.

Standard library only: training code imports it through ``launcher.heartbeat``.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

__all__ = ["DIR_PREFIX", "RECORD", "record_step", "step_dirs"]

#: How the agent's step directory is named: the prefix, then the job's token.
DIR_PREFIX = "launcher-steps-"
#: One process's record: its highest step, and 1 once written.
RECORD = struct.Struct("<qq")
#: Seconds between two looks for a step directory that was not there.
RETRY_INTERVAL = 1.0

_monotonic = time.monotonic
#: ``None`` before the first look; ``()`` while there is no record to write; the mapped page.
_page: Any = None
_retry_at = 0.0
#: The highest step this process reached (``None``: none given yet).
_best: Any = None


def step_dirs(token: str) -> list[str]:
    """Where the step directory of the agent with ``token`` may be, in the order the agent tries
    to make it (the agent and its workers compute the same list: same machine, same environment)."""
    from launcher.private_dirs import temp_root

    name = DIR_PREFIX + token
    return [os.path.join("/dev/shm", name), os.path.join(temp_root(), name)]


def _forget_in_child() -> None:
    # A forked child is another process: it keeps a record of its own, or none.
    global _page, _best, _retry_at
    _page, _best, _retry_at = None, None, 0.0


os.register_at_fork(after_in_child=_forget_in_child)


def _open() -> Any:
    """Map this process's record, creating it in the agent's step directory; ``()`` when there
    is none (yet: looked for again after :data:`RETRY_INTERVAL`)."""
    global _page, _retry_at
    _page = ()
    _retry_at = _monotonic() + RETRY_INTERVAL
    from launcher.recovery import own_token

    token = own_token()
    if not token:
        _retry_at = float("inf")  # not under launcher: never
        return _page
    for folder in step_dirs(token):
        if not os.path.isdir(folder):
            continue
        try:
            import mmap

            fd = os.open(os.path.join(folder, str(os.getpid())), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, RECORD.size)
                _page = mmap.mmap(fd, RECORD.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
        except (OSError, ValueError):  # recording a step must never break training
            _page = ()
        break
    return _page


def record_step(step: Any) -> None:
    """Keep ``step`` if it is the highest this process has reached (see the module docstring)."""
    global _best
    page = _page
    if _best is not None:
        try:
            if not step > _best:
                if page or page is None or _monotonic() < _retry_at:
                    return
                step = _best  # the directory may be there now: write what was reached
        except TypeError:  # not a number: nothing to compare
            return
    if page is None or (not page and _monotonic() >= _retry_at):
        page = _open()
    try:
        value = int(step)
    except (TypeError, ValueError, OverflowError):
        return
    _best = step
    if page:
        try:  # noqa: SIM105 - called every step: a with-block costs several times a try
            RECORD.pack_into(page, 0, value, 1)
        except (struct.error, ValueError):  # beyond int64, or unmapped under us
            pass
