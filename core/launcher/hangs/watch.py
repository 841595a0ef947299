"""Noticing that a rank stopped making progress.

A :class:`HeartbeatTable` is the file of slots the workers' :func:`launcher.heartbeat` writes
into (see :mod:`launcher.hangs.heartbeat` for the layout); the agent maps it read-only. A
:class:`HangWatch` reads it (and, in output mode, the time each worker last wrote a line) and
says which ranks are hung:

* a heartbeat is any sign of progress from the rank: a :func:`launcher.heartbeat` call, a
  collective that completed or an optimizer step (both seen by the workers' start-up hook,
  :mod:`launcher.stragglers.timing`, with no code in the job);
* a rank is watched from its first heartbeat (output mode: its first heartbeat or line);
  one that never sent either is never called hung: its start-up (imports, data, compilation,
  a checkpoint to load) has no bound we could know, and a script that never calls
  :func:`launcher.heartbeat`, uses no collective and no torch optimizer must not be stopped
  for it. It is *reported*, though:
  :attr:`RankProgress.waiting` counts the seconds since it started, which ``launcher status``
  and the hang report show as "no heartbeat yet after N s", and the agent warns once when that
  passes the timeout (``docs/hangs.md``);
* a watched rank is hung when its last sign of progress is older than the timeout;
* inside a ``quiet(name, timeout)`` section, it is hung only once the section's own timeout
  has passed.

Reading 64 slots is one pass over 4 KiB of shared memory: the agent can afford it every
fraction of a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from launcher.hangs.heartbeat import SLOT_SIZE, read_slot, unpack_slot, unpack_steps
from launcher.slot_table import SlotTable


class HeartbeatTable(SlotTable):
    """The heartbeat file of one attempt: ``count`` zeroed slots, mapped by the agent."""

    def __init__(self, path: str, count: int) -> None:
        super().__init__(path, count, SLOT_SIZE)

    def read(self, index: int) -> tuple[float, float, float, str]:
        """``(last beat, quiet deadline, quiet start, quiet name)`` of one slot."""
        return read_slot(self._page, index)

    def read_all(self) -> list[tuple[float, float, float, str, int]]:
        """Every slot, from one consistent copy of the table: :meth:`read`'s tuple and the
        optimizer steps taken."""
        data = self.copy()
        return [(*unpack_slot(data, index * SLOT_SIZE), unpack_steps(data, index * SLOT_SIZE))
                for index in range(self.count)]


@dataclass
class RankProgress:
    """One local rank's progress as the watch sees it."""

    local_rank: int
    #: Seconds since its last heartbeat (or line, in output mode); ``None`` when it never sent one.
    age: float | None
    hung: bool
    #: Name of the quiet section it is in, if any.
    quiet: str = ""
    #: Why it is hung, in words (empty when it is not).
    reason: str = ""
    #: Seconds since it started without any heartbeat (output mode: nor line); ``None`` once it
    #: sent one, or before :meth:`HangWatch.started` was told when it started.
    waiting: float | None = None
    #: Optimizer steps the worker took so far (seen by the start-up hook; 0: none).
    optimizer_steps: int = 0

    def describe(self) -> str:
        """Its heartbeat in words: ``no heartbeat yet after 12 s``, ``last heartbeat 0.3 s ago``."""
        if self.age is None:
            return f"no heartbeat yet after {self.waiting:.0f} s" if self.waiting is not None else "no heartbeat yet"
        return f"last heartbeat {self.age:.1f} s ago"


class HangWatch:
    """Decides which local ranks are hung (see the module docstring)."""

    def __init__(self, table: HeartbeatTable, timeout: float, *, output: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table
        self.timeout = timeout
        self.output = output
        self._clock = clock
        #: Monotonic time of each worker's last output line (output mode).
        self.last_output = [0.0] * table.count
        #: Monotonic time each worker started (0: not known yet), for :attr:`RankProgress.waiting`.
        self.start_times = [0.0] * table.count

    def started(self, local_rank: int, when: float | None = None) -> None:
        """The worker of ``local_rank`` started at ``when`` (now by default)."""
        self.start_times[local_rank] = self._clock() if when is None else when

    def output_seen(self, local_rank: int) -> Callable[[], None]:
        """A callback for the output pump: the worker just wrote something."""
        clock = self._clock
        outputs = self.last_output

        def seen() -> None:
            outputs[local_rank] = clock()

        return seen

    def progress(self, now: float | None = None) -> list[RankProgress]:
        """Every local rank's state, in local-rank order."""
        now = self._clock() if now is None else now
        states = []
        for index, (beat, deadline, started, name, steps) in enumerate(self.table.read_all()):
            last = max(beat, self.last_output[index]) if self.output else beat
            age = now - last if last > 0 else None
            began = self.start_times[index]
            waiting = max(0.0, now - began) if age is None and began > 0 else None
            if deadline > 0:
                hung = now > deadline
                reason = (f"in quiet section {name!r} for {now - started:.1f} s, past its timeout of "
                          f"{deadline - started:.0f} s") if hung else ""
                states.append(RankProgress(index, age, hung, quiet=name, reason=reason, waiting=waiting,
                                           optimizer_steps=steps))
                continue
            hung = age is not None and age > self.timeout
            what = "heartbeat or output line" if self.output else "heartbeat"
            reason = f"no {what} for {age:.1f} s (timeout {self.timeout:g} s)" if hung and age is not None else ""
            states.append(RankProgress(index, age, hung, reason=reason, waiting=waiting, optimizer_steps=steps))
        return states

    def hung(self, now: float | None = None) -> list[RankProgress]:
        """The hung local ranks (empty when all is well)."""
        return [state for state in self.progress(now) if state.hung]
