"""The worker's side of preemption: :func:`preempted`, :func:`preemption_time_left`,
:func:`wait_for_preemption` and :func:`on_preemption`.

Under launcher with preemption handling on, each worker finds in its environment the path of
its agent's notice file (:data:`NOTICE_FILE_ENV`). The first call maps it read-only; every call
after that reads one byte of the mapped page: no system call, well under a microsecond, cheap
enough for every training step. The agent writes the notice there the moment it is preempted
(its own signal, or another node's word through the rendezvous store). Outside launcher, or
with preemption handling off, there is no file and :func:`preempted` is always ``False``.

Only the standard library is imported, so training code can use it without torch and without
paying for launcher's agent.

A scheduler may signal the workers themselves, not only the agent (Slurm signals every process of
a job step): the first call, on the main thread, also installs a handler for the preemption
signals (:data:`NOTICE_SIGNALS_ENV`) where none is installed, so a worker that uses this API is
told by the signal itself rather than killed by it. Once the grace is over, the same signal ends
the worker as it would have without the handler.

File layout (little-endian, :data:`NOTICE_SIZE` bytes, written by :mod:`launcher.preemption.watch`)::

    0   uint8    1 once preempted (written last, after the fields below)
    8   float64  deadline: CLOCK_MONOTONIC seconds by which the workers must have exited
    16  int32    the signal that brought the notice
    20  int32    the group rank of the node that received it
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

#: Path of the agent's notice file.
NOTICE_FILE_ENV = "LAUNCHER_PREEMPTION_FILE"
#: The signals that mean preemption, as numbers (``15,10``).
NOTICE_SIGNALS_ENV = "LAUNCHER_PREEMPTION_SIGNALS"
NOTICE_SIZE = 64
#: ``deadline, signal, group rank`` at offset 8.
FIELDS = struct.Struct("<dii")
FIELDS_OFFSET = 8
#: How often the thread of :func:`on_preemption` and :func:`wait_for_preemption` look.
POLL_INTERVAL = 0.05

#: ``None`` before the first call; ``False`` when off; else the mapped page.
_page: Any = None
_callbacks: list[Callable[[], Any]] = []
_watcher: threading.Thread | None = None
_lock = threading.Lock()
#: Set by the signal handler: the signal came to this worker directly, before (or without) the agent's word.
_signalled: float | None = None


def _open() -> Any:
    global _page
    _page = False
    path = os.environ.get(NOTICE_FILE_ENV)
    if not path:
        return _page
    try:
        import mmap

        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size < NOTICE_SIZE:
                return _page
            _page = mmap.mmap(fd, NOTICE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return _page  # the notice must never break training: off
    _install_handlers()
    return _page


def _install_handlers() -> None:
    """Catch the preemption signals where nothing else does (main thread only, as Python requires)."""
    if threading.current_thread() is not threading.main_thread():
        return
    import signal

    for item in os.environ.get(NOTICE_SIGNALS_ENV, "").split(","):
        try:
            signum = signal.Signals(int(item))
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _on_signal)
        except (ValueError, OSError):
            continue


def _on_signal(signum: int, _frame: Any) -> None:
    global _signalled
    if _signalled is None and not (_page and _page[0] == 1):
        _signalled = time.monotonic()
        return
    left = preemption_time_left()
    if left is not None and left <= 0:
        # The grace is over (the agent's stop): end as the signal's default action would.
        import signal

        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def preempted() -> bool:
    """Whether this job is being preempted: save a checkpoint and exit (``False`` outside launcher)."""
    page = _page if _page is not None else _open()
    return bool(page) and (page[0] == 1 or _signalled is not None)


def preemption_time_left() -> float | None:
    """Seconds left to save and exit once preempted (0.0 when the grace is over); ``None``
    while not preempted."""
    if not preempted():
        return None
    if _page[0] != 1:
        return None  # the signal came first; the agent's notice, with its deadline, follows at once
    deadline, _signal, _node = FIELDS.unpack_from(_page, FIELDS_OFFSET)
    return max(0.0, deadline - time.monotonic())


def wait_for_preemption(timeout: float | None = None) -> bool:
    """Block until the job is preempted (``True``) or ``timeout`` seconds pass (``False``).
    Outside launcher, returns ``False`` at once: no notice can come."""
    if preempted():
        return True
    if not _page:
        return False
    deadline = None if timeout is None else time.monotonic() + timeout
    while not preempted():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL if deadline is None else max(0.0, min(POLL_INTERVAL, deadline - time.monotonic())))
    return True


def on_preemption(callback: Callable[[], Any]) -> None:
    """Call ``callback()`` once, when the job is preempted (never, outside launcher).

    It runs in a daemon thread of this module, within :data:`POLL_INTERVAL` of the notice: keep
    it short (set a flag the training loop checks, say) rather than save from there.
    """
    global _watcher
    with _lock:
        _callbacks.append(callback)
        if _watcher is None and (_page if _page is not None else _open()):
            _watcher = threading.Thread(target=_watch, name="launcher-preemption", daemon=True)
            _watcher.start()


def _watch() -> None:
    wait_for_preemption()
    with _lock:
        callbacks = list(_callbacks)
        _callbacks.clear()
    for callback in callbacks:
        try:
            callback()
        except Exception:  # noqa: BLE001 - one callback's error must not keep the others from running
            import traceback

            traceback.print_exc()


def _forget_in_child() -> None:
    # A forked child (a data-loader worker) has no watcher thread and must not run the
    # parent's callbacks; it can still ask preempted() through the inherited mapping.
    global _watcher, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _callbacks.clear()
    _watcher = None


os.register_at_fork(after_in_child=_forget_in_child)
