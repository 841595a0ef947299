"""Built-in event handlers: ``null`` (alias ``dynamic_rendezvous``), ``console`` and ``jsonl``.

Registered by the core itself (``launcher.plugins.manager.BUILTIN_PLUGINS``). Importing
this module is cheap: the sinks' module is imported only when a sink is created.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launcher.plugins.hookspec import hookimpl
from launcher.plugins.types import EventHandler

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.events.model import EventSink, SinkContext


def _null(context: SinkContext) -> EventSink:
    from launcher.events.sinks import create_null_sink

    return create_null_sink(context)


def _console(context: SinkContext) -> EventSink:
    from launcher.events.sinks import create_console_sink

    return create_console_sink(context)


def _jsonl(context: SinkContext) -> EventSink:
    from launcher.events.sinks import create_jsonl_sink

    return create_jsonl_sink(context)


@hookimpl
def launcher_event_handlers() -> Iterator[EventHandler]:
    """Register the built-in sinks."""
    # torchrun accepts "dynamic_rendezvous" as a handler that discards events: same as null.
    yield EventHandler(
        name="null", aliases=("dynamic_rendezvous",), description="Discard events", create_sink=_null
    )
    yield EventHandler(name="console", description="One line per event on stderr", create_sink=_console)
    yield EventHandler(
        name="jsonl",
        description="Append events as JSON lines to $LAUNCHER_EVENTS_FILE",
        create_sink=_jsonl,
    )
