"""Delivering events to sinks without ever holding up the job.

:class:`EventBus` hands each event to every sink chosen with ``--event-log-handler``. Each sink
runs in a daemon thread of its own behind a bounded queue, so:

* :meth:`EventBus.emit` never waits for a sink: it appends to each queue and returns;
* a slow sink falls behind alone. When its queue is full the **oldest** queued event is dropped
  to make room (the newest events, ``job_failed`` or ``job_succeeded`` among them, say the most
  about the job's state); the first drop is logged at once, the total at close;
* a sink that raises is reported once (logger ``launcher.events``) and keeps receiving events;
  its later errors are only counted (:meth:`EventBus.stats`);
* :meth:`EventBus.close` gives all sinks together at most ``timeout`` seconds to drain and close;
  a sink still busy after that is left behind (its thread is a daemon and cannot keep the
  process alive).

The queue size is the ``LAUNCHER_EVENTS_QUEUE_SIZE`` setting (default 1000 events per sink).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.errors import UsageError
from launcher.events.model import Event, EventSink, EventSinkError, SinkContext

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.plugins.manager import LauncherPluginManager

log = logging.getLogger("launcher.events")

#: Events queued per sink before the oldest are dropped.
DEFAULT_QUEUE_SIZE = 1000
QUEUE_SIZE_SETTING = "LAUNCHER_EVENTS_QUEUE_SIZE"
#: Seconds :meth:`EventBus.close` waits when the process exits without closing the bus.
_ATEXIT_TIMEOUT = 2.0


@dataclass(frozen=True)
class SinkStats:
    """Counts for one sink: events delivered, dropped for lack of room, and failed calls."""

    delivered: int
    dropped: int
    errors: int
    pending: int


class _SinkWorker:
    """One sink, its queue, and the daemon thread that feeds it."""

    def __init__(self, name: str, sink: EventSink, max_queue: int) -> None:
        self.name = name
        self.sink = sink
        self._max_queue = max_queue
        self._queue: deque[Event] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._done = threading.Event()
        self.delivered = 0
        self.dropped = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name=f"launcher-event-sink-{name}", daemon=True)
        self._thread.start()

    def put(self, event: Event) -> None:
        with self._cond:
            if self._closing:
                return
            first_drop = False
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self.dropped += 1
                first_drop = self.dropped == 1
            self._queue.append(event)
            self._cond.notify()
        if first_drop:  # logged outside the lock: a logging handler may be slow
            log.warning(
                "event sink %r is falling behind: its queue of %d events is full, so its oldest "
                "events are being dropped (raise %s to keep more); the count follows at close",
                self.name,
                self._max_queue,
                QUEUE_SIZE_SETTING,
            )

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:  # closing, and everything delivered
                    break
                event = self._queue.popleft()
            try:
                self.sink.emit(event)
                self.delivered += 1
            except BaseException as exc:  # a sink must never take the agent down
                self._report(exc, "emit")
        try:
            self.sink.close()
        except BaseException as exc:
            self._report(exc, "close")
        finally:
            self._done.set()

    def _report(self, exc: BaseException, where: str) -> None:
        self.errors += 1
        if self.errors == 1:
            log.warning(
                "event sink %r failed in %s(): %s: %s; the job goes on, and further errors from this "
                "sink are counted but not logged",
                self.name,
                where,
                type(exc).__name__,
                exc,
            )
            log.debug("event sink %r traceback", self.name, exc_info=exc)

    def begin_close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(max(timeout, 0.0))

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def stats(self) -> SinkStats:
        return SinkStats(self.delivered, self.dropped, self.errors, self.pending())


class EventBus:
    """Fans events out to sinks, each isolated in its own thread (see the module docstring)."""

    def __init__(
        self,
        sinks: Iterable[tuple[str, EventSink]],
        context: SinkContext,
        *,
        max_queue: int = DEFAULT_QUEUE_SIZE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``sinks`` are ``(name, sink)`` pairs; the name is used in warnings and :meth:`stats`."""
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        self.context = context
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._workers = [_SinkWorker(name, sink, max_queue) for name, sink in sinks]
        # Events queued when the process exits without close() would be lost silently.
        atexit.register(self._close_at_exit)

    @property
    def sink_names(self) -> list[str]:
        return [worker.name for worker in self._workers]

    def emit(self, type: str, /, **data: Any) -> Event:
        """Build an event of ``type`` with ``data`` and queue it for every sink; never blocks."""
        event = Event(
            type=type,
            run_id=self.context.run_id,
            node=self.context.node,
            role=self.context.role,
            timestamp=self._clock(),
            data=dict(data),
        )
        self.publish(event)
        return event

    def publish(self, event: Event) -> None:
        """Queue an already built event for every sink; ignored once the bus is closed."""
        if self._closed:
            log.debug("event %s emitted after the event bus was closed; ignored", event.type)
            return
        for worker in self._workers:
            worker.put(event)

    def close(self, timeout: float = 5.0) -> bool:
        """Deliver what is queued and close every sink, waiting ``timeout`` seconds at most in all.

        Returns ``True`` when every sink finished in time. Safe to call more than once.
        """
        with self._lock:
            if self._closed:
                return all(worker.wait(0) for worker in self._workers)
            self._closed = True
        atexit.unregister(self._close_at_exit)
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.begin_close()
        finished = True
        for worker in self._workers:
            if not worker.wait(deadline - time.monotonic()):
                finished = False
                log.warning(
                    "event sink %r did not finish within %.1f s; %d queued events were not delivered",
                    worker.name,
                    timeout,
                    worker.pending(),
                )
            if worker.dropped:
                log.warning(
                    "event sink %r dropped %d events because its queue was full", worker.name, worker.dropped
                )
        return finished

    def stats(self) -> dict[str, SinkStats]:
        """Per-sink counts, by sink name."""
        return {worker.name: worker.stats() for worker in self._workers}

    def _close_at_exit(self) -> None:
        self.close(_ATEXIT_TIMEOUT)

    def __enter__(self) -> EventBus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_handler_names(value: str | Sequence[str]) -> list[str]:
    """``"console,jsonl"`` or ``["console", "jsonl"]`` as a list of names, in order, without repeats."""
    items = [value] if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        for name in item.split(","):
            name = name.strip().lower()
            if name and name not in names:
                names.append(name)
    return names


def create_event_bus(
    names: Sequence[str],
    manager: LauncherPluginManager,
    context: SinkContext,
    *,
    max_queue: int | None = None,
) -> EventBus:
    """Build the bus for ``--event-log-handler`` ``names`` (comma lists accepted), via ``manager``.

    Each name is resolved with ``manager.get(EventHandler, name)`` (a
    :class:`~launcher.plugins.manager.LauncherPluginManager`) and its sink created with
    ``context``. An unknown name, or a sink that cannot start (a missing setting), raises a
    :class:`~launcher.errors.UsageError` before any worker starts; sinks already created are
    closed first. ``null`` sinks get no thread.
    """
    # Imported here: the plugin layer imports this package's model for its types.
    from launcher.events.sinks import NullSink
    from launcher.plugins.types import EventHandler

    if max_queue is None:
        max_queue = context.int_setting(QUEUE_SIZE_SETTING, DEFAULT_QUEUE_SIZE, minimum=1)
    created: list[tuple[str, EventSink]] = []
    try:
        for name in parse_handler_names(names):
            registration = manager.get(EventHandler, name)
            if any(existing == registration.name for existing, _ in created):
                continue  # an alias of a handler already chosen
            try:
                sink = registration.create_sink(context)
            except UsageError:
                raise
            except Exception as exc:
                raise EventSinkError(
                    f"event handler {registration.name!r} could not start: {type(exc).__name__}: {exc}"
                ) from exc
            created.append((registration.name, sink))
    except BaseException:
        for _, sink in created:
            try:
                sink.close()
            except Exception as exc:
                log.debug("closing event sink after a failed start: %s", exc)
        raise
    active = [(name, sink) for name, sink in created if not isinstance(sink, NullSink)]
    return EventBus(active, context, max_queue=max_queue)
