"""Fixtures for event tests: a sink context with a private environment, and test sinks."""

from __future__ import annotations

import threading
import time

import pytest
from launcher.events.model import Event, SinkContext


@pytest.fixture
def context() -> SinkContext:
    """A context whose settings come from an empty environment, not the test runner's."""
    return SinkContext(run_id="job-1", node="node-a", role="trainer", environ={})


class ListSink:
    """Keeps every event; ``closed`` is set by close()."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.closed = threading.Event()
        self.thread_names: set[str] = set()

    def emit(self, event: Event) -> None:
        self.thread_names.add(threading.current_thread().name)
        self.events.append(event)

    def close(self) -> None:
        self.closed.set()


class SleepingSink(ListSink):
    """Takes ``seconds`` for every event: a sink stuck on a network."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def emit(self, event: Event) -> None:
        time.sleep(self.seconds)
        super().emit(event)


class RaisingSink(ListSink):
    """Fails on every event, and on close."""

    def emit(self, event: Event) -> None:
        raise ConnectionError("monitoring is down")

    def close(self) -> None:
        super().close()
        raise RuntimeError("close failed too")
