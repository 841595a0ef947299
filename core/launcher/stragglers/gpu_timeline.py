"""Collectives timed on the GPU's timeline, for straggler detection over NCCL (and gloo on CUDA tensors).

An NCCL collective returns to Python as soon as it is queued: the host's clock around the call
measures nothing. What the rank waited for is on the GPU's timeline: a timing event recorded on
the current stream just before the collective completes when the collective's inputs are ready
(the collective's stream waits for that point of the current stream), and one recorded on the
current stream just after it completes when the collective's result is there (a blocking call
makes the current stream wait for the collective; a DDP comm hook's ``future.then`` callback runs
with streams that wait for it). The time between them is this rank's wait in the collective,
transfer included: the same quantity the wall clock gives over gloo on CPU.

The events are read later, only once the GPU has passed them (``query()`` true), at the next timed
collective or ``launcher.heartbeat(step)`` call: nothing synchronizes a stream, nothing stalls the
host. A collective's time is counted once both its events completed, in the order they were
recorded.

:class:`EventTimeline` is written against a small interface, :class:`EventClock`, so the same
code runs over CUDA (:class:`CudaClock`) and over a fake clock in tests. Standard library only
(torch is imported by :class:`CudaClock`, in a worker that already imported it), and nothing
newer than Python 3.8: :mod:`launcher.stragglers.timing` loads this file into the worker.
"""

from __future__ import annotations

import collections
from typing import Any

#: Collectives recorded and not yet complete, at most: past this (the GPU far behind, or a stream
#: that never runs) new collectives go untimed rather than holding ever more events.
MAX_PENDING = 1024


class EventClock:
    """What :class:`EventTimeline` needs of a device: timing events on the current stream.

    An event (as ``torch.cuda.Event(enable_timing=True)``) has ``record()`` (on the current
    stream), ``query()`` (whether the stream passed it; never blocks) and
    ``elapsed_time(end)`` (milliseconds to ``end``; both must be complete)."""

    def new_event(self) -> Any:
        """A new timing event, not recorded."""
        raise NotImplementedError

    def capturing(self) -> bool:
        """Whether the current stream is being captured into a graph (events are not timed then)."""
        return False


class CudaClock(EventClock):
    """The real clock: ``torch.cuda`` timing events on the current stream."""

    def __init__(self) -> None:
        import torch

        self._event = torch.cuda.Event
        self._capturing = torch.cuda.is_current_stream_capturing

    def new_event(self) -> Any:
        return self._event(enable_timing=True)

    def capturing(self) -> bool:
        return bool(self._capturing())


class EventTimeline:
    """Running totals of the collectives timed on a device's timeline.

    :meth:`begin` before a collective is queued, :meth:`end` once it is (on the stream that
    waits for its result); :meth:`collect` adds up those whose events completed."""

    def __init__(self, clock: EventClock, max_pending: int = MAX_PENDING) -> None:
        self.clock = clock
        self.max_pending = max_pending
        #: Seconds inside the collectives counted so far.
        self.seconds = 0.0
        #: Collectives counted so far.
        self.count = 0
        #: Collectives left untimed (graph capture, or too many pending).
        self.skipped = 0
        self._pending: collections.deque = collections.deque()
        self._free: list = []

    @property
    def pending(self) -> int:
        """Collectives recorded whose events have not both completed yet."""
        return len(self._pending)

    def _event(self) -> Any:
        return self._free.pop() if self._free else self.clock.new_event()

    def begin(self) -> Any:
        """Mark the start of a collective on the current stream: a token for :meth:`end`
        (``None``: not timed)."""
        if len(self._pending) >= self.max_pending or self.clock.capturing():
            self.skipped += 1
            return None
        start = self._event()
        start.record()
        return start

    def end(self, start: Any) -> None:
        """Mark the end of the collective begun with ``start``, on the stream that waits for its result."""
        if start is None:
            return
        end = self._event()
        end.record()
        self._pending.append((start, end))

    def cancel(self, start: Any) -> None:
        """The collective begun with ``start`` was never queued (it raised): forget its start."""
        if start is not None:
            self._free.append(start)

    def collect(self) -> bool:
        """Count the collectives whose events completed, oldest first, without waiting for any;
        whether anything was counted."""
        pending = self._pending
        counted = False
        while pending:
            start, end = pending[0]
            # Both: the end event may be on another stream than the start (a comm hook's callback).
            if not (end.query() and start.query()):
                break
            pending.popleft()
            self.seconds += max(0.0, start.elapsed_time(end)) / 1000.0
            self.count += 1
            self._free.append(start)
            self._free.append(end)
            counted = True
        return counted
