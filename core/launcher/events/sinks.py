"""The built-in event sinks: ``null``, ``console`` and ``jsonl``.

``null``
    discards every event (the default, as with torchrun; ``dynamic_rendezvous`` is an alias,
    because torchrun accepts that name too).
``console``
    one line per event on stderr, through the logger ``launcher.events.console``.
``jsonl``
    appends each event as one line of JSON to the file named by ``LAUNCHER_EVENTS_FILE``. The
    path may contain ``{run_id}``, ``{node}`` and ``{role}``, so agents sharing a file system can
    each write their own file; without them, agents appending to one local file do not tear each
    other's lines (each line is a single ``O_APPEND`` write).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from launcher.events.model import Event, EventSinkError, SinkContext

EVENTS_FILE_SETTING = "LAUNCHER_EVENTS_FILE"
CONSOLE_LOGGER = "launcher.events.console"


class NullSink:
    """Discards events."""

    def emit(self, event: Event) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Do nothing."""


class _StderrHandler(logging.Handler):
    # Looks up sys.stderr at every record instead of keeping the stream it saw first, so
    # redirections made after the sink starts (pytest's capture, an embedding program) apply.
    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def format_console_line(event: Event) -> str:
    """``[launcher event] 12:00:01.250 worker_failed run=job node=host role=trainer rank=3 ...``."""
    from datetime import datetime, timezone  # only the console sink needs it: off the start-up path

    when = datetime.fromtimestamp(event.timestamp, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    parts = [
        f"[launcher event] {when}Z {event.type}",
        f"run={event.run_id}",
        f"node={event.node}",
        f"role={event.role}",
    ]
    parts += [f"{key}={_console_value(value)}" for key, value in event.data.items()]
    return " ".join(parts)


def _console_value(value: Any) -> str:
    if isinstance(value, str) and value and not any(c.isspace() for c in value):
        return value
    import json

    return json.dumps(value, separators=(",", ":"), default=str)


class ConsoleSink:
    """One line per event on stderr, through the ``launcher.events.console`` logger.

    When that logger already has handlers (an embedding program configured it), they are used
    as they are; otherwise the sink attaches a stderr handler for its lifetime.
    """

    def __init__(self) -> None:
        self._logger = logging.getLogger(CONSOLE_LOGGER)
        self._handler: logging.Handler | None = None
        if not self._logger.handlers:
            self._handler = _StderrHandler(logging.INFO)
            self._logger.addHandler(self._handler)
            self._logger.setLevel(logging.INFO)
            # Otherwise a root handler set up by the program would print each event twice.
            self._logger.propagate = False

    def emit(self, event: Event) -> None:
        """Log the event as one line at INFO."""
        self._logger.info("%s", format_console_line(event))

    def close(self) -> None:
        """Detach the handler this sink added, if it added one."""
        if self._handler is not None:
            self._logger.removeHandler(self._handler)
            self._logger.propagate = True
            self._handler = None


class JsonLinesSink:
    """Appends events to a file, one JSON object per line (:meth:`Event.to_json`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        # O_APPEND with one write per line: concurrent writers interleave whole lines only.
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(self, event: Event) -> None:
        """Append one line."""
        if self._fd is None:
            raise ValueError(f"events file {self.path} is closed")
        data = (event.to_json() + "\n").encode("utf-8")
        written = os.write(self._fd, data)
        while written < len(data):  # a short write (full disk, signal): finish the line
            written += os.write(self._fd, data[written:])

    def close(self) -> None:
        """Close the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def events_file_path(context: SinkContext) -> str:
    """The ``LAUNCHER_EVENTS_FILE`` path with its placeholders filled in."""
    template = context.setting(EVENTS_FILE_SETTING)
    if template is None:
        raise EventSinkError(
            f"event handler 'jsonl' needs {EVENTS_FILE_SETTING}: set it to the file that should "
            "receive the events, e.g. "
            f"{EVENTS_FILE_SETTING}=/var/log/launcher/{{run_id}}-{{node}}.jsonl"
        )
    try:
        path = template.format(run_id=context.run_id, node=context.node, role=context.role)
    except (KeyError, IndexError, ValueError) as exc:
        raise EventSinkError(
            f"{EVENTS_FILE_SETTING}={template!r}: only {{run_id}}, {{node}} and {{role}} may appear "
            f"in braces (write {{{{ and }}}} for literal braces): {exc}"
        ) from None
    return os.path.expanduser(path)


def create_null_sink(context: SinkContext) -> NullSink:
    """Factory for ``null``."""
    return NullSink()


def create_console_sink(context: SinkContext) -> ConsoleSink:
    """Factory for ``console``."""
    return ConsoleSink()


def create_jsonl_sink(context: SinkContext) -> JsonLinesSink:
    """Factory for ``jsonl``; :class:`EventSinkError` when the file cannot be opened."""
    path = events_file_path(context)
    try:
        return JsonLinesSink(path)
    except OSError as exc:
        raise EventSinkError(f"cannot open events file {path} ({EVENTS_FILE_SETTING}): {exc}") from None
