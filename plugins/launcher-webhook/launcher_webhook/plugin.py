"""The plugin module the ``launcher`` entry point names: registers the ``webhook`` event handler.

Cheap to import (listing plugins imports it): the sink's module loads only when it is chosen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import EventHandler

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.events.model import EventSink, SinkContext


def _create(context: SinkContext) -> EventSink:
    from launcher_webhook.sink import create_webhook_sink

    return create_webhook_sink(context)


@hookimpl
def launcher_event_handlers() -> Iterator[EventHandler]:
    """Register ``webhook``."""
    yield EventHandler(
        name="webhook",
        description="POST batches of events as JSON to $LAUNCHER_WEBHOOK_URL",
        create_sink=_create,
    )
