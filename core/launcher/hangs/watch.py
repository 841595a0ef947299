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
  has passed;
* with ``--hang-timeout auto`` (a :class:`LearnedTimeouts`): a rank with no progress yet is hung
  once the *start timeout* has passed since it started; after its first progress, once its last
  progress is older than the learned *steady* timeout (the start timeout until one is learned).
  The watch learns from what it already reads each check: when a rank's last beat changed, the
  change is one interval (:mod:`launcher.hangs.learning`; no cost in the workers).

Reading 64 slots is one pass over 4 KiB of shared memory: the agent can afford it every
fraction of a second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher.hangs.heartbeat import SLOT_SIZE, read_slot, unpack_slot, unpack_steps
from launcher.hangs.learning import IntervalLearner, LearningRule
from launcher.slot_table import SlotTable

log = logging.getLogger("launcher.hangs")
#: Where each change of a learned timeout is told (INFO, shown by default: launcher.console).
learned_log = logging.getLogger("launcher.hangs.learned")

#: Intervals after a rank's first progress not learned from (``--hang-timeout auto``). The watch
#: sees, at each check, the span since the last beat it saw and the optimizer steps taken in it:
#: that many intervals (one when the job takes no optimizer steps), none longer than the span.
AUTO_WARMUP = 10
#: Intervals per learned value.
AUTO_WINDOW = 50


def _seconds(value: float) -> str:
    """``42 s``, ``8.4 s``, ``0.25 s``: enough digits to read, no more."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.2g} s"


class LearnedTimeouts:
    """The timeouts ``--hang-timeout auto`` learned for one job: kept by the
    :class:`~launcher.hangs.monitor.HangMonitor` across attempts (restarts and recoveries in
    place), raised by every attempt's :class:`HangWatch` and by other nodes' values."""

    def __init__(self, start: float, *, factor: float, floor: float) -> None:
        #: Seconds from a worker's start to its first progress.
        self.start = start
        #: The rule each rank's intervals are learned with.
        self.rule = LearningRule(factor=factor, floor=floor, warmup=AUTO_WARMUP, window=AUTO_WINDOW)
        #: The learned steady timeout (``None``: none yet, the start timeout applies).
        self.steady: float | None = None

    def offer(self, value: float | None, *, longest: float | None = None, intervals: int = 0,
              source: str = "") -> bool:
        """Raise the steady timeout to ``value`` when it is larger (the maximum over ranks and
        nodes); one INFO line per change. ``longest`` and ``intervals`` say how it was learned
        here, ``source`` where it came from otherwise."""
        if value is None or (self.steady is not None and value <= self.steady):
            return False
        self.steady = value
        if source:
            how = source
        elif longest is not None and self.rule.factor * longest >= self.rule.floor:
            how = (f"{self.rule.factor:g} x the longest interval, {_seconds(longest)}, "
                   f"over {intervals} intervals")
        else:
            how = f"the floor, --hang-floor; the longest interval was {_seconds(longest or 0.0)} over {intervals}"
        learned_log.info("hang timeout (steady) learned: %s (%s)", _seconds(value), how)
        return True

    def as_dict(self) -> dict[str, Any]:
        """For ``launcher status`` and ``/metrics``: seconds per phase (``None``: none learned yet)."""
        return {"start": self.start, "steady": self.steady}


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
                 clock: Callable[[], float] = time.monotonic, learned: LearnedTimeouts | None = None) -> None:
        """``learned``: ``--hang-timeout auto`` (``timeout`` is then unused)."""
        self.table = table
        self.timeout = timeout
        self.output = output
        self._clock = clock
        self.learned = learned
        count = table.count
        # Each rank's learner starts from the value kept from earlier attempts: it only grows.
        self._learners = ([IntervalLearner(learned.rule, learned.steady) for _ in range(count)]
                          if learned is not None else [])
        self._last_beat = [0.0] * count
        self._last_steps = [0] * count
        self._was_quiet = [False] * count
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

    def _learn(self, index: int, beat: float, steps: int, quiet: bool) -> None:
        """A check saw ``beat`` as the rank's last progress: a change since the last check is
        intervals to learn from (not when it spans a quiet section: that has its own timeout)."""
        learned = self.learned
        previous = self._last_beat[index]
        if learned is not None and beat > 0 and beat != previous:
            if previous > 0 and not quiet and not self._was_quiet[index]:
                learner = self._learners[index]
                # What other ranks and nodes learned: this rank's learner only offers more.
                learner.timeout = learned.steady if learner.timeout is None else max(learner.timeout,
                                                                                     learned.steady or 0.0)
                value = learner.observe(beat - previous, max(1, steps - self._last_steps[index]))
                if value is not None:
                    learned.offer(value, longest=learner.last_longest, intervals=learner.seen)
            self._last_beat[index] = beat
            self._last_steps[index] = steps
        self._was_quiet[index] = quiet

    def progress(self, now: float | None = None, *, learn: bool = False) -> list[RankProgress]:
        """Every local rank's state, in local-rank order. ``learn``: the monitor's check (with
        ``--hang-timeout auto``, the beats seen teach the timeout); a status read only looks."""
        now = self._clock() if now is None else now
        states = []
        learned = self.learned
        for index, (beat, deadline, started, name, steps) in enumerate(self.table.read_all()):
            if learn and learned is not None:
                self._learn(index, beat, steps, deadline > 0)
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
            what = "heartbeat or output line" if self.output else "heartbeat"
            if learned is not None:
                if age is None:  # the start phase: its own timeout
                    hung = waiting is not None and waiting > learned.start
                    reason = (f"no {what} yet after {waiting:.1f} s (start timeout {learned.start:g} s)"
                              if hung and waiting is not None else "")
                else:
                    limit, which = ((learned.steady, "learned timeout") if learned.steady is not None
                                    else (learned.start, "start timeout, none learned yet"))
                    hung = age > limit
                    reason = f"no {what} for {age:.1f} s ({which} {_seconds(limit)})" if hung else ""
                states.append(RankProgress(index, age, hung, reason=reason, waiting=waiting,
                                           optimizer_steps=steps))
                continue
            hung = age is not None and age > self.timeout
            reason = f"no {what} for {age:.1f} s (timeout {self.timeout:g} s)" if hung and age is not None else ""
            states.append(RankProgress(index, age, hung, reason=reason, waiting=waiting, optimizer_steps=steps))
        return states

    def hung(self, now: float | None = None) -> list[RankProgress]:
        """The hung local ranks (empty when all is well)."""
        return [state for state in self.progress(now) if state.hung]
