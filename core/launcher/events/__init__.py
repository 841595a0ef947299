"""Lifecycle events of a launch, delivered to pluggable sinks.

* :mod:`launcher.events.model`: :class:`Event`, the event type constants and their fields,
  :class:`EventSink` (what a sink implements) and :class:`SinkContext` (what its factory gets).
* :mod:`launcher.events.bus`: :class:`EventBus`, which isolates each sink in its own thread, and
  :func:`create_event_bus`, which builds one from ``--event-log-handler`` names.
* :mod:`launcher.events.sinks`: the built-in ``null``, ``console`` and ``jsonl`` sinks.

Standard library only. See ``docs/events.md``.
"""

from launcher.events.bus import EventBus, SinkStats, create_event_bus, parse_handler_names
from launcher.events.model import (
    EVENT_FIELDS,
    EVENT_TYPES,
    GROUP_RESTARTED,
    JOB_FAILED,
    JOB_SUCCEEDED,
    MEMBERSHIP_CHANGED,
    RENDEZVOUS_COMPLETED,
    RENDEZVOUS_STARTED,
    SCHEMA_VERSION,
    WORKER_FAILED,
    WORKERS_STARTED,
    Event,
    EventSink,
    EventSinkError,
    SinkContext,
)

__all__ = [
    "EVENT_FIELDS",
    "EVENT_TYPES",
    "GROUP_RESTARTED",
    "JOB_FAILED",
    "JOB_SUCCEEDED",
    "MEMBERSHIP_CHANGED",
    "RENDEZVOUS_COMPLETED",
    "RENDEZVOUS_STARTED",
    "SCHEMA_VERSION",
    "WORKERS_STARTED",
    "WORKER_FAILED",
    "Event",
    "EventBus",
    "EventSink",
    "EventSinkError",
    "SinkContext",
    "SinkStats",
    "create_event_bus",
    "parse_handler_names",
]
