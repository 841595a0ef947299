"""The event model: what the agent reports about a job's lifecycle, and what a sink receives.

Every event is an :class:`Event`: a ``type`` (one of the constants below), the ``run_id``,
``node`` and ``role`` of the agent that emitted it, a ``timestamp`` (seconds since the epoch),
the ``schema_version`` of this model, and ``data``, whose fields depend on the type and are
listed in :data:`EVENT_FIELDS`. Serialised with :meth:`Event.to_json`, one event is one line of
JSON::

    {"type": "worker_failed", "run_id": "job-42", "node": "host-a", "role": "trainer",
     "timestamp": 1700000000.25, "schema_version": 1,
     "data": {"rank": 3, "local_rank": 1, "pid": 4242, "exitcode": null, "signal": 9}}

Compatibility: within one ``schema_version`` fields are only added, never renamed or removed,
so a sink should ignore fields it does not know, and tolerate a field that is absent or ``null``
(its value was not known). Sinks should also pass on event types they do
not know: plugins and later versions may emit more.

A sink is any object with ``emit(event)`` and ``close()`` (:class:`EventSink`); plugins register
one through the ``launcher_event_handlers`` hook, and the agent delivers events to it through
:class:`launcher.events.bus.EventBus`. See ``docs/events.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from launcher.errors import UsageError

_N = TypeVar("_N", int, float)

#: Version of the event layout; bumped only for a change that could break an existing sink.
SCHEMA_VERSION = 1

#: The agent began a rendezvous round.
RENDEZVOUS_STARTED = "rendezvous_started"
#: A rendezvous round completed: this node knows its group rank and the participants.
RENDEZVOUS_COMPLETED = "rendezvous_completed"
#: The agent started its local workers.
WORKERS_STARTED = "workers_started"
#: A local worker exited unsuccessfully (one event per failed worker).
WORKER_FAILED = "worker_failed"
#: The agent stopped its workers and is starting them again after a new rendezvous.
GROUP_RESTARTED = "group_restarted"
#: Nodes joined or left: the agent noticed the set of participants changed.
MEMBERSHIP_CHANGED = "membership_changed"
#: A rank stopped making progress (--hang-timeout): every rank's stack was taken.
HANG_DETECTED = "hang_detected"
#: The ranks that hold the others changed: a straggler was named, or one cleared (launcher.stragglers).
STRAGGLER_DETECTED = "straggler_detected"
#: A node failed a health check, or was put out as a straggler, and stays out of the job (launcher.health,
#: launcher.stragglers).
NODE_EXCLUDED = "node_excluded"
#: The job is being preempted: every rank was told, and has the grace to save and exit (launcher.preemption).
PREEMPTED = "preempted"
#: Every worker of this node succeeded; the job is done here.
JOB_SUCCEEDED = "job_succeeded"
#: The job failed here for good (restarts exhausted, or an error the agent cannot recover from).
JOB_FAILED = "job_failed"

#: The ``data`` fields of each event type the core emits, each with a one-line meaning.
#: Documented in ``docs/events.md``; a test keeps the two in step. A field whose value is not
#: known in some situation is ``null`` or absent, and later versions may add fields.
EVENT_FIELDS: Mapping[str, Mapping[str, str]] = {
    RENDEZVOUS_STARTED: {
        "restart_count": "restarts of the worker group so far (0 for the first rendezvous)",
    },
    RENDEZVOUS_COMPLETED: {
        "round": "rendezvous round number; grows with every re-rendezvous",
        "group_rank": "this node's rank among the participants",
        "group_world_size": "number of participating nodes",
        "participants": (
            "participating node names, in group-rank order; only in rounds of up to 256 nodes (each node "
            "would read the whole list from the store to write it in a larger one)"
        ),
        "duration": "seconds this node spent in the rendezvous",
    },
    WORKERS_STARTED: {
        "restart_count": "restarts so far (the workers' TORCHELASTIC_RESTART_COUNT)",
        "group_rank": "this node's rank among the participants",
        "workers": (
            "one object per local worker: local_rank, rank (global), pid, and cpus (the CPUs it "
            'is bound to, e.g. "0-3,8", or null when unbound)'
        ),
        "in_place": "true when the workers resumed in place (launcher.recoverable); absent after a start or restart",
        "replaced": "in place: the local ranks whose process had died and were started afresh",
    },
    WORKER_FAILED: {
        "rank": "global rank of the failed worker",
        "local_rank": "its local rank",
        "pid": "its process id",
        "exitcode": "its exit status, or null when a signal killed it",
        "signal": "number of the signal that killed it, or null",
    },
    GROUP_RESTARTED: {
        "count": "restarts used so far, this one included",
        "reason": "one line: the failure that caused the restart",
        "cause": '"failure" (a worker exited) or "hang" (a rank stopped making progress)',
        "mode": '"restart" (every worker stopped and started again) or "in-place recovery" (docs/recovery.md)',
        "kept": "in place: the local ranks whose process is kept",
        "replaced": "in place: the local ranks whose process died (a fresh one starts)",
        "fallback": "a restart where the workers used launcher.recoverable: why it was not in place",
    },
    MEMBERSHIP_CHANGED: {
        "lost": "names of nodes that stopped responding (empty when nodes only joined)",
        "waiting": "number of nodes waiting to join",
    },
    HANG_DETECTED: {
        "detected_by": "name of the node that saw a rank stop making progress",
        "reason": "one line: which rank, and for how long",
        "hung_ranks": "global ranks found hung, on the nodes that answered",
        "groups": 'ranks grouped by identical main-thread stack: [{"ranks": [...], "stack": "f (a.py:1) <- ..."}]',
        "stacks_file": "this node's file with every thread's full stack",
        "outcome": "what happens next: a restart, or the job fails",
    },
    STRAGGLER_DETECTED: {
        "stragglers": ('the ranks named now (empty once all cleared): [{"rank", "node", "local_rank", '
                       '"ratio" (how many times slower than the median rank), "evidence" (one line)}]'),
        "cleared": "global ranks no longer named since the last event",
        "threshold": "the --straggler-threshold ratio in force",
    },
    NODE_EXCLUDED: {
        "excluded_node": "host name of the node kept out of the job (a straggler: its rendezvous node id)",
        "addr": "its address, or null when it announced none",
        "check": "name of the health check it failed, or straggler (--straggler-action exclude)",
        "reason": "one line: what the check found, or the straggler's verdict",
    },
    PREEMPTED: {
        "signal": "name of the signal that meant preemption (SIGTERM, SIGUSR1, ...)",
        "received_by": "name of the node that received it (this node, or the one whose notice reached it)",
        "grace": "seconds this node's workers have to save and exit",
    },
    JOB_SUCCEEDED: {
        "restart_count": "restarts used",
        "in_place_recoveries": "how many of them were in-place recoveries (docs/recovery.md)",
    },
    JOB_FAILED: {
        "reason": "one line: why the job failed on this node",
        "failures": "number of failed workers, when workers failed",
        "step": "with reason 'no progress': the furthest step the job reached, which its last restarts did not pass",
        "no_progress_restarts": "with reason 'no progress': the restarts in a row that ended before passing it",
    },
}

#: Every event type the core emits.
EVENT_TYPES: frozenset[str] = frozenset(EVENT_FIELDS)


@dataclass(frozen=True)
class Event:
    """One lifecycle event. Immutable: every sink sees the same object.

    ``data`` holds the type's fields (:data:`EVENT_FIELDS`); values must be JSON-able (strings,
    numbers, booleans, ``None``, lists and dicts of those).
    """

    type: str
    run_id: str
    node: str
    role: str
    timestamp: float
    schema_version: int = SCHEMA_VERSION
    data: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """The event as a JSON-able dict, in the documented field order."""
        return {
            "type": self.type,
            "run_id": self.run_id,
            "node": self.node,
            "role": self.role,
            "timestamp": self.timestamp,
            "schema_version": self.schema_version,
            "data": dict(self.data),
        }

    def to_json(self) -> str:
        """One line of JSON (no newline inside, whatever the data holds)."""
        # default=str: an odd value (a Path, a set) must not cost the event.
        import json  # only sinks that serialise pay for it

        return json.dumps(self.to_dict(), separators=(",", ":"), default=str)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        """Inverse of :meth:`to_dict`; unknown top-level keys are ignored."""
        return cls(
            type=data["type"],
            run_id=data.get("run_id", ""),
            node=data.get("node", ""),
            role=data.get("role", ""),
            timestamp=float(data["timestamp"]),
            schema_version=int(data.get("schema_version", SCHEMA_VERSION)),
            data=dict(data.get("data") or {}),
        )

    @classmethod
    def from_json(cls, text: str) -> Event:
        """Inverse of :meth:`to_json`."""
        import json

        return cls.from_dict(json.loads(text))


@runtime_checkable
class EventSink(Protocol):
    """Where events go. Created by an event handler's ``create_sink(context)``.

    ``emit`` is called from a thread of its own per sink, one event at a time, in order; it may
    block (on a network, a disk) without delaying the job, but each sink's queue is bounded, so a
    sink slower than the events loses the oldest ones. ``close`` is called once, after the last
    ``emit``, and should flush. Exceptions from either are reported once and otherwise ignored.
    """

    def emit(self, event: Event) -> None:
        """Deliver one event."""

    def close(self) -> None:
        """Flush and release resources; no ``emit`` follows."""


class EventSinkError(UsageError):
    """A chosen event sink cannot start (a missing or invalid setting): the job does not start."""


@dataclass(frozen=True)
class SinkContext:
    """What a sink factory gets: who is emitting, and the settings of the environment.

    ``environ`` is the environment the settings are read from (the agent's, by default); sinks
    read their ``LAUNCHER_*`` settings from it rather than from :data:`os.environ`, so a test or an
    embedder can pass its own.
    """

    run_id: str
    node: str
    role: str
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ), hash=False)
    #: Every flag group's settings object by group name (a plugin's flags: ``launcher_flag_groups``).
    settings: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def setting(self, name: str, default: str | None = None) -> str | None:
        """The setting ``name``, or ``default`` when it is unset or empty."""
        value = self.environ.get(name, "")
        return value if value.strip() else default

    def int_setting(self, name: str, default: int, *, minimum: int = 0) -> int:
        """An integer setting; :class:`EventSinkError` naming it when it is not one."""
        return self._number_setting(name, default, minimum, int, "an integer")

    def float_setting(self, name: str, default: float, *, minimum: float = 0.0) -> float:
        """A number setting (seconds, usually); :class:`EventSinkError` when it is not one."""
        return self._number_setting(name, default, minimum, float, "a number")

    def _number_setting(self, name: str, default: _N, minimum: _N, parse: Callable[[str], _N], what: str) -> _N:
        value = self.setting(name)
        if value is None:
            return default
        try:
            number = parse(value)
        except ValueError:
            raise EventSinkError(f"{name}={value!r} is not {what}") from None
        if not number >= minimum:  # also rejects NaN
            raise EventSinkError(f"{name}={value!r} must be at least {minimum}")
        return number
