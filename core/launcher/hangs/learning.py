"""The learning rule for learned hang timeouts (issue 46, part 2: ``--hang-timeout auto``).

These pure functions are the rule the agent applies (:class:`launcher.hangs.watch.HangWatch`) to
the intervals it sees between a rank's progress events (the beats of ``launcher.hangs.watch``), so
that it can be tested, and argued about, on its own.

The rule, after NVIDIA's ft_launcher (a safety factor times the longest interval observed, the
maximum over all ranks), with two changes that keep false alarms away:

* the first :attr:`LearningRule.warmup` intervals after a rank's first progress are not learned
  from (the first steps: compilation, allocator growth, the first communicators), and until a
  first value is learned the start's own timeout applies;
* a value is learned per window of :attr:`LearningRule.window` intervals, ``factor`` times the
  longest interval in it, never below :attr:`LearningRule.floor`, and it **only grows** (by at
  least :attr:`LearningRule.min_growth`, so that a slowly rising maximum gives few changes, each
  one INFO line): ft_launcher averages each new value 50/50 with the last, which lets a rare long
  interval (an evaluation every few thousand steps) fall out of what is learned, and then
  fire. A rank's silence longer than the learned value is a hang, not a sample.

Values from several ranks or nodes combine with :func:`merge` (the maximum): one rank's long
interval (rank 0 logging, evaluating) must not make the others look hung.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["IntervalLearner", "LearningRule", "learn", "merge"]


@dataclass(frozen=True)
class LearningRule:
    """The constants of the rule (see the module docstring)."""

    #: The learned timeout is this many times the longest interval seen.
    factor: float = 5.0
    #: Seconds: never less.
    floor: float = 60.0
    #: Intervals after the first progress that are not learned from.
    warmup: int = 10
    #: Intervals per learned value.
    window: int = 50
    #: A new value replaces the last only when at least this share larger.
    min_growth: float = 0.1

    def __post_init__(self) -> None:
        if not (self.factor >= 1 and self.floor > 0 and self.warmup >= 0 and self.window >= 1
                and self.min_growth >= 0):
            raise ValueError(f"invalid learning rule: {self}")


def learn(rule: LearningRule, previous: float | None, longest: float) -> float:
    """The timeout after a window whose longest interval was ``longest`` seconds, the last value
    being ``previous`` (``None``: none learned yet)."""
    candidate = max(rule.floor, rule.factor * max(0.0, longest))
    if previous is None or candidate >= previous * (1.0 + rule.min_growth):
        return candidate
    return previous


def merge(values: Iterable[float | None]) -> float | None:
    """The value that applies to all of ``values`` (ranks, nodes): the largest; ``None`` when none
    was learned."""
    learned = [value for value in values if value is not None]
    return max(learned) if learned else None


class IntervalLearner:
    """One rank's (or one phase's) learned timeout, fed one interval at a time."""

    def __init__(self, rule: LearningRule | None = None, timeout: float | None = None) -> None:
        """``timeout``: a value learned before (kept across restarts), which the rule only raises."""
        self.rule = rule or LearningRule()
        #: The learned timeout (``None`` until the first window after warm-up is complete).
        self.timeout = timeout
        #: Intervals observed so far, warm-up included.
        self.seen = 0
        self._longest = 0.0
        self._in_window = 0
        #: The longest interval of the last complete window (for the line that tells the value).
        self.last_longest = 0.0

    def observe(self, interval: float, count: int = 1) -> float | None:
        """Learn from ``count`` intervals between progress events, the longest at most
        ``interval`` seconds (an observer that samples sees several at once: the agent sees the
        span between two looks and the optimizer steps taken in it); the new timeout when it
        changed (the caller logs it), else ``None``."""
        before = self.seen
        self.seen += max(1, count)
        counted = self.seen - max(before, self.rule.warmup)
        if counted <= 0:
            return None
        if before >= self.rule.warmup:
            # A span that straddles the warm-up's end holds warm-up time (a slow first batch, the
            # first communicators), which would be learned as a step: its intervals count, its length not.
            self._longest = max(self._longest, interval)
        self._in_window += counted
        if self._in_window < self.rule.window:
            return None
        value = learn(self.rule, self.timeout, self._longest)
        self.last_longest = self._longest
        self._longest, self._in_window = 0.0, 0
        if value == self.timeout:
            return None
        self.timeout = value
        return value
