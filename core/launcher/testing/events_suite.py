"""Conformance suite for event handlers (``launcher_event_handlers``).

``create_sink(context)`` returns an object with ``emit(event)`` and ``close()``, or raises
:class:`~launcher.events.model.EventSinkError` (a usage error) when a setting is missing or
wrong. The sink must take every event type the core emits, types it does not know and fields
it does not know (plugins and later versions add them), and deliver through the agent's
:class:`~launcher.events.bus.EventBus` without errors.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from launcher.errors import UsageError
from launcher.events.model import (
    EVENT_FIELDS,
    GROUP_RESTARTED,
    JOB_FAILED,
    JOB_SUCCEEDED,
    MEMBERSHIP_CHANGED,
    RENDEZVOUS_COMPLETED,
    RENDEZVOUS_STARTED,
    WORKER_FAILED,
    WORKERS_STARTED,
    Event,
    EventSink,
    SinkContext,
)
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import EventHandler, Registration
from launcher.testing.plugin_suite import PluginModuleConformance, manager_holding

__all__ = ["EventHandlerConformance", "sample_events"]

_SAMPLE_DATA: dict[str, dict[str, Any]] = {
    RENDEZVOUS_STARTED: {"restart_count": 0},
    RENDEZVOUS_COMPLETED: {
        "round": 0,
        "group_rank": 0,
        "group_world_size": 2,
        "participants": ["host-a_1_0", "host-b_2_0"],
        "duration": 0.25,
    },
    WORKERS_STARTED: {
        "restart_count": 0,
        "group_rank": 0,
        "workers": [
            {"local_rank": 0, "rank": 0, "pid": 4242, "cpus": "0-3"},
            {"local_rank": 1, "rank": 1, "pid": 4243, "cpus": None},
        ],
    },
    WORKER_FAILED: {"rank": 1, "local_rank": 1, "pid": 4243, "exitcode": None, "signal": 9},
    GROUP_RESTARTED: {"count": 1, "reason": "worker 1 (rank 1) was killed by SIGKILL"},
    MEMBERSHIP_CHANGED: {"lost": ["host-b_2_0"], "waiting": 0},
    JOB_SUCCEEDED: {"restart_count": 1},
    JOB_FAILED: {"reason": "restarts exhausted", "failures": 1},
}


def sample_events(run_id: str = "conformance", node: str = "host-a", role: str = "default") -> list[Event]:
    """One event of every type the core emits, then the shapes a sink must tolerate.

    The tolerated shapes: an unknown type, an unknown extra field, a field left ``None`` and a
    field left out.
    """
    now = time.time()
    events = [
        Event(type=kind, run_id=run_id, node=node, role=role, timestamp=now + i, data=dict(_SAMPLE_DATA.get(kind, {})))
        for i, kind in enumerate(EVENT_FIELDS)
    ]
    events += [
        Event("plugin_specific_event", run_id, node, role, now, data={"anything": [1, "two", None]}),
        Event(JOB_SUCCEEDED, run_id, node, role, now, data={"restart_count": 0, "added_later": {"x": 1}}),
        Event(WORKER_FAILED, run_id, node, role, now, data={"rank": 0, "local_rank": 0, "pid": None}),
        Event(JOB_FAILED, run_id, node, role, now, data={}),
    ]
    return events


class EventHandlerConformance(PluginModuleConformance):
    """Tests an event handler's sink, alone and through the agent's event bus.

    Set ``event_handler_name`` (the ``--event-log-handler`` name) or override the
    ``event_handler`` fixture, and override ``sink_environ`` to give the sink its settings
    (``LAUNCHER_EVENTS_FILE``-style variables, e.g. pointing into ``tmp_path``).
    ``delivery_timeout`` is how long the bus may take to deliver every sample event and close.
    """

    registration_type: ClassVar[type[Registration]] = EventHandler
    registration_fixture: ClassVar[str] = "event_handler"

    #: The ``--event-log-handler`` name under test.
    event_handler_name: ClassVar[str | None] = None
    #: Seconds the bus may take to deliver the sample events and close the sink.
    delivery_timeout: ClassVar[float] = 5.0

    @pytest.fixture
    def event_handler(self, plugin_manager: LauncherPluginManager) -> EventHandler:
        """The registration under test (default: ``event_handler_name`` on the plugin manager)."""
        return self.registration_under_test(plugin_manager, self.event_handler_name, EventHandler)

    @pytest.fixture
    def sink_environ(self) -> Mapping[str, str]:
        """Override: the settings the sink reads (``SinkContext.environ``)."""
        return {}

    def context(self, environ: Mapping[str, str]) -> SinkContext:
        """The context the agent would give the sink's factory."""
        return SinkContext(run_id="conformance", node="host-a", role="default", environ=dict(environ))

    def test_creates_a_sink(self, event_handler: EventHandler, sink_environ: Mapping[str, str]) -> None:
        sink = event_handler.create_sink(self.context(sink_environ))
        try:
            assert isinstance(sink, EventSink), f"create_sink returned {sink!r}, which lacks emit or close"
        finally:
            sink.close()

    def test_takes_every_event(self, event_handler: EventHandler, sink_environ: Mapping[str, str]) -> None:
        sink = event_handler.create_sink(self.context(sink_environ))
        try:
            for event in sample_events():
                sink.emit(event)
        finally:
            sink.close()

    def test_closes_without_events(self, event_handler: EventHandler, sink_environ: Mapping[str, str]) -> None:
        event_handler.create_sink(self.context(sink_environ)).close()

    def test_delivers_through_the_event_bus(self, event_handler: EventHandler, sink_environ: Mapping[str, str]) -> None:
        from launcher.events.bus import create_event_bus

        manager = manager_holding(event_handler)
        bus = create_event_bus([event_handler.name], manager, self.context(sink_environ))
        events = sample_events()
        for event in events:
            bus.publish(event)
        delivered = bus.close(timeout=self.delivery_timeout)
        stats = bus.stats()
        assert delivered, f"the sink did not take {len(events)} events and close within {self.delivery_timeout:g} s"
        for name, counts in stats.items():
            assert counts.errors == 0, f"sink {name!r} raised on {counts.errors} calls (see the launcher.events log)"
            assert counts.dropped == 0, f"sink {name!r} fell behind and lost {counts.dropped} events"

    def test_missing_settings_are_usage_errors(self, event_handler: EventHandler) -> None:
        # Without its settings a sink may still start; if it cannot, the launcher must be able to
        # print one line and stop before any worker starts.
        try:
            sink = event_handler.create_sink(self.context({}))
        except UsageError as exc:
            assert str(exc).strip() and len(str(exc).strip().splitlines()) == 1, "the error must be one line"
            return
        sink.close()
