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
  has passed; a checkpoint (``torch.save``, ``torch.distributed.checkpoint``) is such a section
  with no code change (the start-up hook's), its deadline infinity in the slot: the watch applies
  :meth:`section_timeout` (learned with ``auto``: :meth:`LearnedTimeouts.checkpoint_timeout`);
* a rank's silence does not count the time in which another rank of the job was in a live quiet
  section (not ``exiting``, not past its deadline): it may be waiting for it in a collective.
  The watch records those spans at the monitor's checks; another node's come through the
  store, asked for only when a rank would be hung otherwise (:mod:`launcher.hangs.monitor`);
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

from launcher.hangs.heartbeat import SLOT_SIZE, read_slot, unpack_checkpoints, unpack_slot, unpack_steps
from launcher.hangs.learning import IntervalLearner, LearningRule, learn
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
#: The quiet section a rank enters once its job's code is over (its ``atexit`` beat): a peer that
#: waits meanwhile is not waiting for it (the rank will enter no collective again).
EXITING_SECTION = "exiting"


def _seconds(value: float) -> str:
    """``42 s``, ``8.4 s``, ``0.25 s``: enough digits to read, no more."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.2g} s"


class LearnedTimeouts:
    """The timeouts ``--hang-timeout auto`` learned for one job: kept by the
    :class:`~launcher.hangs.monitor.HangMonitor` across attempts (restarts and recoveries in
    place), raised by every attempt's :class:`HangWatch` and by other nodes' values."""

    #: The phases learned (attributes of the same names; ``start`` is given, not learned).
    PHASES = ("steady", "checkpoint")

    def __init__(self, start: float, *, factor: float, floor: float) -> None:
        #: Seconds from a worker's start to its first progress.
        self.start = start
        #: The rule each rank's intervals are learned with.
        self.rule = LearningRule(factor=factor, floor=floor, warmup=AUTO_WARMUP, window=AUTO_WINDOW)
        #: The learned steady timeout (``None``: none yet, the start timeout applies).
        self.steady: float | None = None
        #: The learned checkpoint timeout: ``factor`` x the longest checkpoint any rank took, never
        #: below the floor (``None``: no checkpoint seen yet, :meth:`checkpoint_timeout` says what applies).
        self.checkpoint: float | None = None

    def offer(self, value: float | None, *, longest: float | None = None, intervals: int = 0,
              source: str = "", phase: str = "steady") -> bool:
        """Raise the ``phase`` timeout (``steady`` or ``checkpoint``) to ``value`` when it is larger
        (the maximum over ranks and nodes); one INFO line per change. ``longest`` and
        ``intervals`` say how it was learned here, ``source`` where it came from otherwise."""
        current = getattr(self, phase)
        if value is None or (current is not None and value <= current):
            return False
        setattr(self, phase, value)
        what = "interval" if phase == "steady" else "checkpoint"
        if source:
            how = source
        elif longest is not None and self.rule.factor * longest >= self.rule.floor:
            how = f"{self.rule.factor:g} x the longest {what}, {_seconds(longest)}"
            how += f", over {intervals} intervals" if phase == "steady" else ""
        elif phase == "steady":
            how = f"the floor, --hang-floor; the longest interval was {_seconds(longest or 0.0)} over {intervals}"
        else:
            how = f"the floor, --hang-floor; the longest checkpoint took {_seconds(longest or 0.0)}"
        learned_log.info("hang timeout (%s) learned: %s (%s)", phase, _seconds(value), how)
        return True

    def checkpoint_timeout(self) -> float:
        """Seconds a checkpoint may take: the learned value, or the start timeout before any
        checkpoint was seen (a first checkpoint has no bound known yet, like the start);
        never less than the steady timeout (a checkpoint never judges a rank more strictly)."""
        value = self.checkpoint if self.checkpoint is not None else self.start
        return max(value, self.steady or 0.0)

    def as_dict(self) -> dict[str, Any]:
        """For ``launcher status`` and ``/metrics``: seconds per phase (``None``: none learned yet)."""
        return {"start": self.start, "steady": self.steady, "checkpoint": self.checkpoint}


def _merged(spans: list[list[float]]) -> list[list[float]]:
    """``spans`` (``[start, end]`` each) in order, the overlapping ones joined (new lists)."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


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
        return [row[:5] for row in self.read_rows()]

    def read_rows(self) -> list[tuple[float, float, float, str, int, float]]:
        """:meth:`read_all`'s tuples and the longest checkpoint each worker took (seconds, 0: none)."""
        data = self.copy()
        return [(*unpack_slot(data, index * SLOT_SIZE), unpack_steps(data, index * SLOT_SIZE),
                 unpack_checkpoints(data, index * SLOT_SIZE)[0]) for index in range(self.count)]


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

    #: Quiet spans kept (the latest ones: a silence longer than all of them is a hang anyway).
    SPANS = 32

    def __init__(self, table: HeartbeatTable, timeout: float, *, output: bool = False,
                 clock: Callable[[], float] = time.monotonic, learned: LearnedTimeouts | None = None,
                 remote_quiet: Callable[[float], tuple[float, float] | None] | None = None) -> None:
        """``learned``: ``--hang-timeout auto`` (``timeout`` is then unused). ``remote_quiet``:
        given the time now, the last span ``(start, end)`` (monotonic) in which a rank of another
        node was in a quiet section, or ``None``; asked only at the monitor's checks, and only when
        a local rank would otherwise be hung or a long interval be learned (the store is not read
        otherwise)."""
        self.table = table
        self.timeout = timeout
        self.output = output
        self._clock = clock
        self.learned = learned
        self._remote = remote_quiet
        count = table.count
        # Each rank's learner starts from the value kept from earlier attempts: it only grows.
        self._learners = ([IntervalLearner(learned.rule, learned.steady) for _ in range(count)]
                          if learned is not None else [])
        self._last_beat = [0.0] * count
        self._last_steps = [0] * count
        self._was_quiet = [False] * count
        self._last_checkpoint = [0.0] * count
        #: The spans ``[start, end]`` (monotonic, merged, in order) in which some rank of the job
        #: was in a live quiet section: silence within them is waiting, not a hang.
        self._spans: list[list[float]] = []
        #: Local ranks seen in a live quiet section at the last look, and when each began.
        self._open: dict[int, float] = {}
        self._looked = 0.0
        #: ``(start, now)`` of the local quiet sections live at the last look (``None``: none):
        #: the monitor tells the other nodes, whose ranks may be waiting for them.
        self.local_quiet: tuple[float, float] | None = None
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

    def section_timeout(self, name: str) -> float:
        """Seconds an automatic quiet section (the start-up hook's ``checkpoint``) may last."""
        return self.learned.checkpoint_timeout() if self.learned is not None else self.timeout

    # -- quiet spans: a rank waiting for another rank's quiet section is not silent --------------

    def add_span(self, start: float, end: float) -> None:
        """Some rank of the job was in a quiet section from ``start`` to ``end``."""
        if end > start:
            self._spans = _merged([*self._spans, [start, end]])[-self.SPANS:]

    def excused(self, since: float, now: float, spans: list[list[float]] | None = None) -> float:
        """Seconds of ``since`` .. ``now`` in which some rank of the job was in a quiet section
        (``spans``: those to count, merged; the ones recorded by default)."""
        return sum(max(0.0, min(end, now) - max(start, since))
                   for start, end in (self._spans if spans is None else spans) if end > since)

    def _ask_remote(self, now: float) -> None:
        """Ask for another node's last quiet span (multi-node only; the monitor limits the reads)."""
        if self._remote is not None:
            span = self._remote(now)
            if span is not None:
                self.add_span(*span)

    def _look_at_sections(self, rows: list[tuple[float, float, float, str, int, float]], now: float,
                          record: bool) -> tuple[list[float], list[list[float]]]:
        """Each rank's quiet deadline in force (an automatic section's is the agent's timeout;
        0: none), and the quiet spans to excuse silence with. ``record`` (the monitor's check):
        the live sections (not ``exiting``, not past their deadline) are recorded as spans; else
        (a status read, from another thread) nothing here changes."""
        deadlines = []
        live: dict[int, float] = {}
        for index, (_, deadline, started, name, _, _) in enumerate(rows):
            if deadline == float("inf"):
                deadline = started + self.section_timeout(name)
            deadlines.append(deadline)
            if deadline > 0 and now <= deadline and name != EXITING_SECTION:
                live[index] = started
        if not record:
            spans = self._spans
            return deadlines, _merged([*spans, [min(live.values()), now]]) if live else spans
        for index, started in self._open.items():
            if index not in live:  # over since the last look: at its deadline, or at its closing beat
                beat, deadline = rows[index][0], deadlines[index]
                end = min(now, deadline) if deadline > 0 else min(now, beat) if beat > started else self._looked
                self.add_span(started, end)
        self._open = live
        self._looked = now
        if live:
            earliest = min(live.values())
            self.add_span(earliest, now)
            self.local_quiet = (earliest, now)
        else:
            self.local_quiet = None
        return deadlines, self._spans

    # -- learning and judging --------------------------------------------------------------------

    def _learn(self, index: int, beat: float, steps: int, quiet: bool, now: float) -> None:
        """A check saw ``beat`` as the rank's last progress: a change since the last check is
        intervals to learn from (not when it spans the rank's own quiet section: that has its own
        timeout; less the time another rank was in one, which the rank spent waiting)."""
        learned = self.learned
        previous = self._last_beat[index]
        if learned is not None and beat > 0 and beat != previous:
            if previous > 0 and not quiet and not self._was_quiet[index]:
                learner = self._learners[index]
                # What other ranks and nodes learned: this rank's learner only offers more.
                learner.timeout = learned.steady if learner.timeout is None else max(learner.timeout,
                                                                                     learned.steady or 0.0)
                interval = beat - previous - self.excused(previous, beat)
                if learned.rule.factor * interval > (learned.steady or learned.rule.floor):
                    # Long enough to raise the value: was a rank of another node quiet meanwhile?
                    self._ask_remote(now)
                    interval = beat - previous - self.excused(previous, beat)
                value = learner.observe(max(0.0, interval), max(1, steps - self._last_steps[index]))
                if value is not None:
                    learned.offer(value, longest=learner.last_longest, intervals=learner.seen)
            self._last_beat[index] = beat
            self._last_steps[index] = steps
        self._was_quiet[index] = quiet

    def _learn_checkpoint(self, index: int, longest: float) -> None:
        """The longest checkpoint of a rank grew: the checkpoint timeout may grow with it."""
        learned = self.learned
        if learned is None or longest <= self._last_checkpoint[index]:
            return
        self._last_checkpoint[index] = longest
        value = learn(learned.rule, learned.checkpoint, longest)
        if value != learned.checkpoint:
            learned.offer(value, longest=longest, phase="checkpoint")

    def progress(self, now: float | None = None, *, learn: bool = False) -> list[RankProgress]:
        """Every local rank's state, in local-rank order. ``learn``: the monitor's check (with
        ``--hang-timeout auto``, the beats seen teach the timeout; another node's quiet sections
        may be asked for); a status read only looks."""
        now = self._clock() if now is None else now
        rows = self.table.read_rows()
        deadlines, spans = self._look_at_sections(rows, now, learn)
        states = []
        learned = self.learned
        for index, (beat, raw_deadline, started, name, steps, longest) in enumerate(rows):
            if learn and learned is not None:
                self._learn(index, beat, steps, raw_deadline > 0, now)
                self._learn_checkpoint(index, longest)
            last = max(beat, self.last_output[index]) if self.output else beat
            age = now - last if last > 0 else None
            began = self.start_times[index]
            waiting = max(0.0, now - began) if age is None and began > 0 else None
            deadline = deadlines[index]
            if deadline > 0:
                hung = now > deadline
                reason = (f"in quiet section {name!r} for {now - started:.1f} s, past its timeout of "
                          f"{_seconds(deadline - started)}") if hung else ""
                states.append(RankProgress(index, age, hung, quiet=name, reason=reason, waiting=waiting,
                                           optimizer_steps=steps))
                continue
            hung, reason = self._judge(now, last if last > 0 else None, began, learn, spans)
            states.append(RankProgress(index, age, hung, reason=reason, waiting=waiting, optimizer_steps=steps))
        return states

    def _judge(self, now: float, last: float | None, began: float, ask: bool,
               spans: list[list[float]]) -> tuple[bool, str]:
        """Whether a rank outside any quiet section of its own is hung, and why. Its silence
        counts from its last progress (before any, from its start under ``auto``), less the time
        in which another rank of the job was in a quiet section: a rank waiting in a collective for
        a peer that checkpoints is not hung. Another node is asked (``ask``) only when the rank
        would be hung otherwise."""
        learned = self.learned
        what = "heartbeat or output line" if self.output else "heartbeat"
        if last is None and (learned is None or began <= 0):
            return False, ""  # a fixed timeout watches a rank from its first progress
        if learned is None:
            limit, which, since = self.timeout, f"timeout {self.timeout:g} s", last
        elif last is None:
            limit, which, since = learned.start, f"start timeout {_seconds(learned.start)}", began
        elif learned.steady is not None:
            limit, which, since = learned.steady, f"learned timeout {_seconds(learned.steady)}", last
        else:
            limit, which, since = learned.start, f"start timeout, none learned yet {_seconds(learned.start)}", last
        assert since is not None
        silent = now - since
        excused = self.excused(since, now, spans)
        if silent - excused > limit and ask:
            self._ask_remote(now)
            excused = self.excused(since, now)
        if silent - excused <= limit:
            return False, ""
        head = f"no {what} yet after {silent:.1f} s" if last is None else f"no {what} for {silent:.1f} s"
        if excused > 0:
            head += f", {excused:.1f} s of it waiting while another rank was in a quiet section"
        return True, f"{head} ({which})"

    def hung(self, now: float | None = None) -> list[RankProgress]:
        """The hung local ranks (empty when all is well)."""
        return [state for state in self.progress(now) if state.hung]
