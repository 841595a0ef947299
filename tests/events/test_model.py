"""The event model: serialisation, and the documentation of every type and field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from launcher.events import model
from launcher.events.model import EVENT_FIELDS, EVENT_TYPES, Event, EventSinkError, SinkContext

DOCS = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def test_json_round_trip() -> None:
    event = Event(
        type=model.WORKERS_STARTED,
        run_id="job-1",
        node="node-a",
        role="trainer",
        timestamp=1700000000.25,
        data={"restart_count": 0, "workers": [{"local_rank": 0, "rank": 0, "pid": 10, "cpus": "0-3"}]},
    )
    line = event.to_json()
    assert "\n" not in line
    parsed = json.loads(line)
    assert list(parsed) == ["type", "run_id", "node", "role", "timestamp", "schema_version", "data"]
    assert parsed["schema_version"] == model.SCHEMA_VERSION == 1
    assert Event.from_json(line) == event


def test_event_is_immutable_and_odd_values_still_serialise() -> None:
    event = Event("job_failed", "r", "n", "x", 1.0, data={"path": Path("/tmp/x"), "text": "a\nb"})
    with pytest.raises(AttributeError):
        event.type = "other"  # type: ignore[misc]
    assert json.loads(event.to_json())["data"] == {"path": "/tmp/x", "text": "a\nb"}


def test_every_type_has_a_constant() -> None:
    constants = {
        value
        for name, value in vars(model).items()
        if name.isupper() and isinstance(value, str) and value in EVENT_TYPES
    }
    assert (
        constants
        == EVENT_TYPES
        == {
            "rendezvous_started",
            "rendezvous_completed",
            "workers_started",
            "hang_detected",
            "worker_failed",
            "group_restarted",
            "membership_changed",
            "node_excluded",
            "straggler_detected",
            "preempted",
            "job_succeeded",
            "job_failed",
        }
    )


def test_docs_describe_every_type_and_field() -> None:
    text = DOCS.read_text()
    for event_type, fields in EVENT_FIELDS.items():
        section = re.search(rf"\*\*`{event_type}`\*\*(.*?)(?=\n\*\*`|\n## )", text, re.S)
        assert section, f"docs/events.md has no section for {event_type}"
        for name in fields:
            assert f"| `{name}` |" in section.group(1), f"{event_type}.{name} undocumented"
    for envelope in ("type", "run_id", "node", "role", "timestamp", "schema_version", "data"):
        assert f"| `{envelope}` |" in text
    for setting in ("LAUNCHER_EVENTS_FILE", "LAUNCHER_EVENTS_QUEUE_SIZE"):
        assert setting in text


def test_context_settings() -> None:
    context = SinkContext(
        "r", "n", "x", environ={"A": "3", "B": " ", "C": "x", "D": "-1", "E": "0.5", "F": "nan"}
    )
    assert context.setting("A") == "3"
    assert context.setting("B") is None and context.setting("B", "d") == "d"
    assert context.int_setting("A", 1) == 3 and context.int_setting("Z", 7) == 7
    assert context.float_setting("E", 1.0) == 0.5
    with pytest.raises(EventSinkError, match="C='x' is not an integer"):
        context.int_setting("C", 1)
    with pytest.raises(EventSinkError, match="at least 0"):
        context.int_setting("D", 1)
    with pytest.raises(EventSinkError):
        context.float_setting("F", 1.0)
    assert isinstance(SinkContext("r", "n", "x").environ, dict)  # defaults to os.environ's copy
