"""Which rank holds the others: a deterministic function of every rank's timings over a window.

Every node computes it from the same inputs (the nodes' summaries of the same intervals,
:mod:`launcher.stragglers.cluster`), so every node names the same ranks. Pure arithmetic, no
clock and no randomness: the unit tests feed it synthetic numbers.

The measure. Over the window each rank spends ``span`` seconds, ``wait`` of them inside
collectives and the rest, ``work``, outside (computing, loading data, anything). Collectives
make every rank's step as long as the slowest rank's, so the slow rank's extra work shows as
the others' wait. A rank is named when

* its share of time at work is at least ``threshold`` times the median share of the *other*
  ranks (the median of the others, not of all: with two ranks the median of all would halve the
  gap), and
* the others are waiting for it: their median share of time in collectives is at least half the
  extra share it works, and more than its own.

Without collectives in the window but with ``launcher.heartbeat(step)`` calls (ranks that never
wait for each other), the measure is the time per step against the median of the others'.

:class:`StragglerTracker` adds hysteresis: a rank is named after ``raise_after`` windows in a
row over the threshold and cleared after ``clear_after`` windows in a row below the clearing
level (half-way back to 1), so a rank near the threshold does not flap.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

#: Windows in a row over the threshold before a rank is named, and below the clearing level before it is cleared.
RAISE_AFTER = 2
CLEAR_AFTER = 2
#: A share of work below this is "all waiting": the ratio's reference is floored there.
MIN_SHARE = 1e-3
#: A window spans at least this many intervals, and grows (up to :data:`MAX_INTERVALS`) until
#: every rank in it finished :data:`MIN_EVENTS` collectives (or steps): a mean over 20 steps
#: keeps 10% noise per step within a few percent, however long a step is.
MIN_INTERVALS = 4
MAX_INTERVALS = 60
MIN_EVENTS = 20


class RankSample(NamedTuple):
    """One rank's timings over some seconds (one interval, or a window of them summed)."""

    rank: int
    node: str
    local_rank: int
    #: Seconds observed.
    span: float
    #: Of them, seconds inside collectives.
    wait: float
    #: Collectives finished.
    collectives: int
    #: ``launcher.heartbeat(step)`` calls.
    steps: int

    @property
    def work_share(self) -> float:
        return max(0.0, self.span - self.wait) / self.span if self.span > 0 else 0.0

    @property
    def wait_share(self) -> float:
        return min(1.0, self.wait / self.span) if self.span > 0 else 0.0

    @property
    def step_time(self) -> float:
        """Seconds per step; a rank that made no step in the window took longer than the window."""
        return self.span / self.steps if self.steps else 2.0 * self.span


class Finding(NamedTuple):
    """One rank judged against the others."""

    rank: int
    node: str
    local_rank: int
    #: How many times the median of the other ranks (work share, or time per step).
    ratio: float
    #: ``collectives`` or ``steps``: what was compared.
    basis: str
    #: This rank's share of time outside collectives, and the median of the others'.
    work_share: float
    others_work_share: float
    #: This rank's share of time in collectives, and the median of the others'.
    wait_share: float
    others_wait_share: float
    #: Steps per second of this rank and the median of the others' (0: no heartbeat(step)).
    step_rate: float
    others_step_rate: float
    #: Whether the others wait for it (collectives), or always (steps).
    holds_others: bool
    window: float

    def over(self, threshold: float) -> bool:
        return self.holds_others and self.ratio >= threshold


def window(intervals: Iterable[Iterable[RankSample]]) -> list[RankSample]:
    """Each rank's samples summed over the intervals (in rank order)."""
    sums: dict[int, RankSample] = {}
    for interval in intervals:
        for s in interval:
            old = sums.get(s.rank)
            sums[s.rank] = s if old is None else old._replace(
                span=old.span + s.span, wait=old.wait + s.wait, collectives=old.collectives + s.collectives,
                steps=old.steps + s.steps)
    return [sums[rank] for rank in sorted(sums)]


def _idle(samples: Sequence[RankSample]) -> bool:
    return not any(s.collectives or s.wait or s.steps for s in samples)


def select_window(history: Mapping[int, Sequence[RankSample]], newest: int) -> list[Sequence[RankSample]] | None:
    """The intervals to judge at ``newest``: back from it, idle ones (nothing measured on any
    rank: the job is between phases, or over) left out, until the window is long enough (see
    :data:`MIN_EVENTS`). ``None`` when ``newest`` itself is missing or idle: no new evidence."""
    latest = history.get(newest)
    if not latest or _idle(latest):
        return None
    chosen: list[Sequence[RankSample]] = []
    events: dict[int, int] = {}
    for number in range(newest, newest - MAX_INTERVALS, -1):
        samples = history.get(number)
        if samples is None:
            if len(chosen) < MIN_INTERVALS:
                return None  # the job's first seconds: too little to judge yet
            break
        if _idle(samples):
            continue
        chosen.append(samples)
        for s in samples:
            events[s.rank] = events.get(s.rank, 0) + max(s.collectives, s.steps)
        if len(chosen) >= MIN_INTERVALS and min(events.values()) >= MIN_EVENTS:
            break
    return chosen


def _rate(sample: RankSample) -> float:
    return sample.steps / sample.span if sample.span > 0 else 0.0


class _Medians:
    """The median of a list of numbers with one of them left out, for any of them, in O(log n):
    exactly what :func:`statistics.median` gives for the list without it."""

    def __init__(self, values: list[float]) -> None:
        self.values = sorted(values)

    def without(self, value: float) -> float:
        data, index = self.values, bisect_left(self.values, value)  # any copy of value: the same rest
        n = len(data) - 1

        def at(i: int) -> float:
            return data[i] if i < index else data[i + 1]

        if n % 2 == 1:
            return at(n // 2)
        return (at(n // 2 - 1) + at(n // 2)) / 2


def judge(samples: Sequence[RankSample]) -> list[Finding]:
    """Every rank of ``samples`` (one window) against the median of the others; ``[]`` when
    fewer than two ranks measured anything."""
    # A sample comes only from a rank that had measured something before the interval: one with
    # nothing in this window (computing through it while the others wait) is the likeliest straggler.
    ranks = [s for s in samples if s.span > 0]
    if len(ranks) < 2:
        return []
    collectives = sum(1 for s in ranks if s.collectives > 0 or s.wait > 0) >= 2
    if not collectives and sum(1 for s in ranks if s.steps > 0) < 2:
        return []
    # The median of the others, for every rank: each list sorted once, then one value left out
    # (O(ranks log ranks): one node judges every rank of the job, 16,384 of them on 2,048 nodes).
    work = _Medians([o.work_share for o in ranks])
    wait = _Medians([o.wait_share for o in ranks])
    rate = _Medians([_rate(o) for o in ranks])
    step = _Medians([o.step_time for o in ranks])
    findings = []
    for s in ranks:
        others_work = work.without(s.work_share)
        others_wait = wait.without(s.wait_share)
        others_rate = rate.without(_rate(s))
        if collectives:
            ratio = s.work_share / max(others_work, MIN_SHARE)
            extra = s.work_share - others_work
            holds = extra > 0 and others_wait >= 0.5 * extra and others_wait > s.wait_share
            basis = "collectives"
        else:
            ratio = s.step_time / max(step.without(s.step_time), 1e-9)
            holds, basis = True, "steps"
        findings.append(Finding(s.rank, s.node, s.local_rank, ratio, basis, s.work_share, others_work,
                                s.wait_share, others_wait, _rate(s), others_rate, holds, s.span))
    return findings


class Change(NamedTuple):
    """What a window changed: the ranks named now (empty: none), and those cleared by it."""

    named: list[Finding]
    cleared: list[Finding]


class StragglerTracker:
    """Hysteresis over :func:`judge`'s findings, window after window (see the module docstring)."""

    def __init__(self, threshold: float, *, raise_after: int = RAISE_AFTER, clear_after: int = CLEAR_AFTER) -> None:
        self.threshold = threshold
        #: Below this a named rank counts towards clearing: half-way from the threshold back to 1.
        self.clear_level = 1.0 + (threshold - 1.0) / 2.0
        self.raise_after = raise_after
        self.clear_after = clear_after
        self._over: dict[int, int] = {}
        self._under: dict[int, int] = {}
        #: The ranks named now, with their latest finding.
        self.named: dict[int, Finding] = {}
        #: The worst finding of every rank ever named, for the final report.
        self.history: dict[int, Finding] = {}

    def update(self, findings: Sequence[Finding]) -> Change | None:
        """Take one window's findings; the change to the named ranks, or ``None`` when none.

        No findings (no rank measured anything) is no evidence: nothing changes.
        """
        if not findings:
            return None
        seen = {f.rank: f for f in findings}
        added, cleared = [], []
        for rank, finding in seen.items():
            if finding.over(self.threshold):
                self._over[rank] = self._over.get(rank, 0) + 1
            else:
                self._over.pop(rank, None)
            if rank in self.named:
                below = not finding.holds_others or finding.ratio < self.clear_level
                self._under[rank] = self._under.get(rank, 0) + 1 if below else 0
                if self._under[rank] >= self.clear_after:
                    cleared.append(finding)
                    del self.named[rank]
                    self._under.pop(rank, None)
                    self._over.pop(rank, None)
                else:
                    self.named[rank] = finding
            elif self._over.get(rank, 0) >= self.raise_after:
                self.named[rank] = finding
                added.append(finding)
        for rank in list(self.named):
            if rank not in seen:  # gone (its worker ended, or its node's summary is missing): not judged
                self._under[rank] = self._under.get(rank, 0) + 1
                if self._under[rank] >= self.clear_after:
                    cleared.append(self.named.pop(rank))
                    self._under.pop(rank, None)
        for finding in self.named.values():
            best = self.history.get(finding.rank)
            if best is None or finding.ratio > best.ratio:
                self.history[finding.rank] = finding
        if not added and not cleared:
            return None
        return Change(sorted(self.named.values(), key=lambda f: f.rank), cleared)
