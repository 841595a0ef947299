"""The worker's side of hang detection: :func:`heartbeat` and :func:`quiet`.

Under launcher (with ``--hang-timeout``) each worker finds in its environment a file of
fixed-size slots (:data:`HEARTBEAT_FILE_ENV`) and its slot number (:data:`HEARTBEAT_SLOT_ENV`).
The first call maps its slot into memory; every call after that stores one monotonic timestamp
into the mapped page: no system call (``time.monotonic`` is served by the vDSO), no lock, well
under a microsecond. The agent reads the same page. Outside launcher the first call finds no
file and every later call returns at once.

Only the standard library is imported, so training code can call it without torch and
without paying for launcher's agent.

Only the worker process itself beats: its pid is recorded in :data:`HEARTBEAT_PID_ENV` at its
start-up (by launcher's ``sitecustomize``, or by the worker bootstrap of function and preloaded
workers), and every other process (a data-loader worker forked before or after the first beat, a
``multiprocessing`` spawn child, a subprocess) inherits that pid, finds it is not its own, and
never opens the slot: its progress is not the rank's. A fork also drops the parent's open slot
(an at-fork hook registered at import), so a forked child looks again on its first call.

Slot layout (little-endian, :data:`SLOT_SIZE` bytes, shared with :mod:`launcher.hangs.watch`)::

    0   float64  last heartbeat, CLOCK_MONOTONIC seconds (0: never)
    8   float64  deadline of the current quiet section, CLOCK_MONOTONIC (0: none)
    16  float64  start of the current quiet section
    24  40 bytes name of the current quiet section, UTF-8, NUL padded
    64  int64    optimizer steps this worker took (written by the start-up hook's optimizer
                 step hook, :mod:`launcher.stragglers.timing`, which also stores its beats at 0)
    72  float64  the longest checkpoint this worker took, seconds (the start-up hook's automatic
                 ``checkpoint`` sections, whose deadline at 8 is infinity: the agent's timeout)
    80  int64    checkpoints it finished
    88  40 bytes reserved

Progress is not only this module's calls: the start-up hook stores a beat at offset 0 whenever a
collective of the rank completes or it takes an optimizer step, so a job that never calls
:func:`heartbeat` is watched too (``docs/hangs.md``).
"""

from __future__ import annotations

import math
import os
import struct
import sys
import time
from types import TracebackType
from typing import Any

#: Path of the agent's heartbeat file (one slot per local worker).
HEARTBEAT_FILE_ENV = "LAUNCHER_HEARTBEAT_FILE"
#: This worker's slot in it (its local rank; given separately because of --virtual-local-rank).
HEARTBEAT_SLOT_ENV = "LAUNCHER_HEARTBEAT_SLOT"
#: The pid of the one process allowed to beat for the slot (the worker, recorded at its start-up).
HEARTBEAT_PID_ENV = "LAUNCHER_HEARTBEAT_PID"

SLOT_SIZE = 128
NAME_SIZE = 40
_BEAT = struct.Struct("<d")
_STEPS = struct.Struct("<q")
#: Where a slot holds its optimizer-step count (the same in launcher.stragglers.timing).
STEPS_OFFSET = 64
_QUIET = struct.Struct(f"<dd{NAME_SIZE}s")
_QUIET_OFFSET = 8

_monotonic = time.monotonic
_pack_beat = _BEAT.pack_into
#: ``None`` before the first call; ``()`` when off; ``(mapped page, slot offset)`` when on.
_state: Any = None
_mapping: Any = None
#: launcher.stragglers.timing.record_step, once heartbeat(step) was called.
_step_writer: Any = None
#: CLOCK_MONOTONIC time of the next try to map a slot that could not be mapped (0: no retry due).
_retry_at = 0.0
#: Seconds between two tries to map the slot after an error (the file was briefly unreachable).
RETRY_INTERVAL = 1.0


def claim(*, force: bool = False) -> None:
    """Record this process as the one that beats for the slot, unless one already is (or
    ``force``: the caller knows this process is the worker).

    Called at the worker's start-up, before any child can exist (launcher's ``sitecustomize``
    does the same for script workers), and at import as a fallback for interpreters that skip
    ``sitecustomize`` (``-I``, ``-E``, ``-S``). Children inherit the record and so never beat.
    """
    environ = os.environ
    if environ.get(HEARTBEAT_FILE_ENV) and (force or not environ.get(HEARTBEAT_PID_ENV)):
        environ[HEARTBEAT_PID_ENV] = str(os.getpid())


def _forget_in_child() -> None:
    # The child looks again on its first call (and finds that the slot is not its own).
    global _state, _mapping
    _state = None
    _mapping = None


def _open() -> Any:
    """Map this worker's slot, once; ``()`` when not running under launcher's hang watch, or
    when this process is not the worker (a child of it).

    Under launcher, a refusal that is not the expected one (a child of the worker) is said once
    on stderr: a rank that beats into nothing is otherwise invisible. A slot that cannot be
    mapped (an error) is tried again every :data:`RETRY_INTERVAL` seconds."""
    global _state, _mapping, _retry_at
    path = os.environ.get(HEARTBEAT_FILE_ENV)
    slot = os.environ.get(HEARTBEAT_SLOT_ENV, "")
    _state = ()
    _retry_at = 0.0
    if not path or not slot.isdigit():
        return _state
    claim()
    recorded = os.environ.get(HEARTBEAT_PID_ENV, "")
    if recorded != str(os.getpid()):
        # A data-loader worker, a spawned child: not the rank's progress, and nothing to say.
        if not (recorded.isdigit() and int(recorded) in _ancestors()):
            _say(f"launcher.heartbeat() in pid {os.getpid()} does nothing: {HEARTBEAT_PID_ENV}={recorded!r} names "
                 "neither this process nor one of its parents (a wrapper that runs the training script as a "
                 f"child should remove {HEARTBEAT_PID_ENV} from the child's environment; docs/hangs.md)")
        return _state
    try:
        import mmap

        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            offset = int(slot) * SLOT_SIZE
            if offset + SLOT_SIZE <= size:
                _mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:  # a heartbeat must never break training: say so, try again later
        _retry_at = _monotonic() + RETRY_INTERVAL
        _say(f"launcher.heartbeat() in pid {os.getpid()} cannot map slot {slot} of {path}: {exc}; trying again "
             f"every {RETRY_INTERVAL:g} s")
        return _state
    if offset + SLOT_SIZE > size:
        _say(f"launcher.heartbeat() in pid {os.getpid()}: slot {slot} is outside {path} ({size} bytes)")
        return _state
    _state = (_mapping, offset)
    return _state


_said: set[str] = set()


def _say(line: str) -> None:
    """``line`` on stderr, once per process (never raises)."""
    key = line.split(":", 1)[0] + line[-40:]
    if key in _said:
        return
    _said.add(key)
    try:
        sys.stderr.write(f"launcher: {line}\n")
        sys.stderr.flush()
    except Exception:  # noqa: S110 - a closed or broken stderr: nothing else to tell
        pass


def _ancestors() -> set[int]:
    """The pids of this process's parents, up to init (from ``/proc``; empty where it cannot be read)."""
    found: set[int] = set()
    pid = os.getppid()
    while pid > 1 and pid not in found and len(found) < 256:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                pid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


# At import, not at the first beat: whenever a child is forked, it drops what its parent opened
# and asks again (and, not being the recorded worker, gets nothing).
os.register_at_fork(after_in_child=_forget_in_child)
claim()


def heartbeat(step: int | None = None) -> None:
    """Tell the agent this rank is making progress (a no-op outside launcher).

    Call it once per step (or more often): a rank that has called it once and then does not
    for ``--hang-timeout`` seconds is reported as hung. Costs well under a microsecond.
    ``step``, the training step just finished, gives ``--straggler-detection`` each rank's step
    rate (``docs/stragglers.md``), and tells the agent how far the job got, which
    ``--max-no-progress-restarts`` judges restarts by (``docs/failures.md``).
    """
    state = _state
    if state is None or (not state and _retry_at and _monotonic() >= _retry_at):
        state = _open()
    if state:
        _pack_beat(state[0], state[1], _monotonic())
    if step is not None:
        writer = _step_writer
        if writer is None:
            writer = _load_step_writer()
        writer(step)


def _load_step_writer() -> Any:
    # Loaded at the first step given: the step record that --max-no-progress-restarts judges by
    # (launcher.hangs.progress), and with --straggler-detection the straggler slot's step too.
    global _step_writer
    from launcher.hangs.progress import record_step as record_progress
    from launcher.stragglers.timing import STRAGGLER_FILE_ENV, record_step

    if not os.environ.get(STRAGGLER_FILE_ENV):
        _step_writer = record_progress
        return record_progress

    def both(step: int) -> None:
        record_step(step)
        record_progress(step)

    _step_writer = both
    return both


class quiet:  # noqa: N801 - used like a function: ``with launcher.quiet("checkpoint", timeout=600):``
    """A phase expected to send no heartbeat (a checkpoint, an evaluation), with its own timeout.

    ::

        with launcher.quiet("checkpoint", timeout=600):
            save_checkpoint()

    Inside, the rank is hung only once ``timeout`` seconds have passed since the section began;
    leaving it counts as a heartbeat. Sections nest (the inner one applies while it lasts).
    Outside launcher it does nothing.
    """

    def __init__(self, name: str, timeout: float) -> None:
        if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"quiet({name!r}): timeout must be a positive number of seconds, got {timeout!r}")
        self.name = str(name)
        self.timeout = float(timeout)
        self._previous: tuple[Any, ...] | None = None

    def __enter__(self) -> quiet:
        state = _state if _state is not None else _open()
        if state:
            page, offset = state
            self._previous = _QUIET.unpack_from(page, offset + _QUIET_OFFSET)
            now = _monotonic()
            name = self.name.encode("utf-8", "replace")[:NAME_SIZE]
            _QUIET.pack_into(page, offset + _QUIET_OFFSET, now + self.timeout, now, name)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        state = _state
        if state and self._previous is not None:
            page, offset = state
            _pack_beat(page, offset, _monotonic())
            _QUIET.pack_into(page, offset + _QUIET_OFFSET, *self._previous)
            self._previous = None


def read_slot(page: Any, index: int) -> tuple[float, float, float, str]:
    """``(last beat, quiet deadline, quiet start, quiet name)`` of slot ``index`` (agent side)."""
    return unpack_slot(stable_copy(page, index * SLOT_SIZE, SLOT_SIZE), 0)


def stable_copy(page: Any, offset: int, size: int) -> bytes:
    """``size`` bytes of ``page`` from ``offset``, read until two reads agree.

    The writers store eight bytes at a time without a lock: a torn read must not pass for a
    stale heartbeat.
    """
    while True:
        first = page[offset : offset + size]
        if first == page[offset : offset + size]:
            return bytes(first)


def unpack_steps(data: bytes, offset: int) -> int:
    """The optimizer steps of the slot at ``offset`` of ``data`` (0: none seen)."""
    return int(_STEPS.unpack_from(data, offset + STEPS_OFFSET)[0])


#: Where a slot holds its checkpoints: the longest (seconds) and how many (the same in
#: launcher.stragglers.timing).
CHECKPOINTS_OFFSET = 72
_CHECKPOINTS = struct.Struct("<dq")


def unpack_checkpoints(data: bytes, offset: int) -> tuple[float, int]:
    """The longest checkpoint (seconds) and the checkpoints finished of the slot at ``offset``."""
    longest, count = _CHECKPOINTS.unpack_from(data, offset + CHECKPOINTS_OFFSET)
    return float(longest), int(count)


def unpack_slot(data: bytes, offset: int) -> tuple[float, float, float, str]:
    """Decode the slot at ``offset`` of ``data`` (see the layout in the module docstring)."""
    (beat,) = _BEAT.unpack_from(data, offset)
    deadline, started, raw = _QUIET.unpack_from(data, offset + _QUIET_OFFSET)
    name = raw.rstrip(b"\0").decode("utf-8", "replace") if deadline else ""
    return beat, deadline, started, name
