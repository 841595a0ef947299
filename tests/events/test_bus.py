"""EventBus: fan-out, isolation of slow and failing sinks, bounded queues, bounded close."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from launcher.events.bus import EventBus, parse_handler_names
from launcher.events.model import JOB_SUCCEEDED, WORKERS_STARTED, Event, SinkContext

from .conftest import ListSink, RaisingSink, SleepingSink


def _warnings(caplog: pytest.LogCaptureFixture, sink: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "launcher.events" and r.levelno >= logging.WARNING and repr(sink) in r.getMessage()
    ]


def test_fan_out_in_order(context: SinkContext) -> None:
    first, second = ListSink(), ListSink()
    bus = EventBus([("first", first), ("second", second)], context, clock=lambda: 42.0)
    sent = [bus.emit(WORKERS_STARTED, restart_count=0, workers=[]), bus.emit(JOB_SUCCEEDED, restart_count=0)]
    assert bus.close(timeout=5)
    for sink in (first, second):
        assert sink.events == sent
        assert sink.closed.is_set()
        assert sink.thread_names and threading.current_thread().name not in sink.thread_names
    assert sent[0] == Event(
        WORKERS_STARTED, "job-1", "node-a", "trainer", 42.0, data={"restart_count": 0, "workers": []}
    )
    assert bus.stats()["first"].delivered == 2


def test_data_may_have_a_field_called_type(context: SinkContext) -> None:
    sink = ListSink()
    bus = EventBus([("s", sink)], context)
    bus.emit("custom", type="nested")
    bus.close()
    assert sink.events[0].type == "custom" and sink.events[0].data == {"type": "nested"}


def test_slow_and_failing_sinks_never_block_or_kill_the_job(
    context: SinkContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="launcher.events")
    slow, failing, good = SleepingSink(10.0), RaisingSink(), ListSink()
    bus = EventBus([("slow", slow), ("failing", failing), ("good", good)], context)

    started = time.monotonic()
    for i in range(50):
        bus.emit(WORKERS_STARTED, index=i)
    assert time.monotonic() - started < 0.5  # emit only queues

    deadline = time.monotonic() + 5
    while len(good.events) < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(good.events) == 50

    started = time.monotonic()
    assert bus.close(timeout=1.0) is False  # the slow sink could not finish
    assert time.monotonic() - started < 2.0

    # The failing sink: 50 failed emits and a failed close, reported once.
    assert len(_warnings(caplog, "failing")) == 1
    assert "monitoring is down" in _warnings(caplog, "failing")[0]
    assert bus.stats()["failing"].errors == 51
    assert failing.closed.is_set()
    # The slow sink is named in one warning, with what it did not deliver.
    slow_warnings = _warnings(caplog, "slow")
    assert len(slow_warnings) == 1 and "did not finish within 1.0 s" in slow_warnings[0]
    assert good.closed.is_set()


def test_full_queue_drops_the_oldest_with_a_counted_warning(
    context: SinkContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="launcher.events")
    gate = threading.Event()

    class GatedSink(ListSink):
        def emit(self, event: Event) -> None:
            gate.wait(10)
            super().emit(event)

    sink = GatedSink()
    bus = EventBus([("gated", sink)], context, max_queue=5)
    for i in range(20):
        bus.emit("tick", i=i)
    gate.set()
    assert bus.close(timeout=5)
    received = [event.data["i"] for event in sink.events]
    # The first event may already have been taken by the sink's thread before the gate; after it,
    # only the newest five survive.
    assert received[-5:] == [15, 16, 17, 18, 19]
    assert len(received) <= 6
    stats = bus.stats()["gated"]
    assert stats.dropped == 20 - len(received)
    messages = _warnings(caplog, "gated")
    assert any("falling behind" in m for m in messages)
    assert any(f"dropped {stats.dropped} events" in m for m in messages)
    assert len(messages) == 2


def test_emit_after_close_is_ignored_and_close_is_idempotent(context: SinkContext) -> None:
    sink = ListSink()
    bus = EventBus([("s", sink)], context)
    assert bus.close()
    bus.emit("late")
    assert bus.close()
    assert sink.events == []


def test_bus_without_sinks(context: SinkContext) -> None:
    with EventBus([], context) as bus:
        bus.emit("anything")
    assert bus.stats() == {}


def test_parse_handler_names() -> None:
    assert parse_handler_names("console, JSONL,,console") == ["console", "jsonl"]
    assert parse_handler_names(["null", "console,jsonl"]) == ["null", "console", "jsonl"]
    assert parse_handler_names("") == []
