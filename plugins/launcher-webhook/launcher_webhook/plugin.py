"""The plugin module the ``launcher`` entry point names: registers the ``webhook`` event handler.

Cheap to import (listing plugins and every launch import it, with the flags' declaration,
:mod:`launcher_webhook.flags`): the flags' reader loads only when a webhook flag is used, the sink's
module only when it is chosen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import EventHandler

from launcher_webhook.flags import FLAGS

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.events.model import EventSink, SinkContext
    from launcher.flags import FlagGroup

    from launcher_webhook.flags import WebhookOptions


def _create(context: SinkContext) -> EventSink:
    from launcher_webhook.sink import create_webhook_sink

    return create_webhook_sink(context)


@hookimpl
def launcher_event_handlers() -> Iterator[EventHandler]:
    """Register ``webhook``."""
    yield EventHandler(
        name="webhook",
        description="POST batches of events as JSON to --webhook-url ($LAUNCHER_WEBHOOK_URL)",
        create_sink=_create,
    )


@hookimpl
def launcher_flag_groups() -> Iterator[FlagGroup[WebhookOptions]]:
    """``--webhook-url`` and the batch settings (:mod:`launcher_webhook.settings`)."""
    yield FLAGS
