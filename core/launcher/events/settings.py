"""The events flag: ``--event-log-handler``, the sinks lifecycle events go to.

Declared, parsed and checked here (:data:`FLAGS`); :func:`read_events` gives one
:class:`EventSettings`. The names are resolved to plugins when the plan is built.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

from typing import NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import quote

__all__ = ["FLAGS", "EventSettings", "parse_handler_list", "read_events"]


class EventSettings(NamedTuple):
    """The event sinks' names, in the order given."""

    handlers: tuple[str, ...] = ("null",)


def parse_handler_list(value: str, flag: str = "--event-log-handler") -> tuple[str, ...]:
    """A comma list of event sink names; an empty list or an empty item is refused, not skipped."""
    names = [item.strip() for item in value.split(",")]
    if not all(names):
        what = "names no" if not any(names) else "has an empty"
        raise UsageError(f"{flag} {quote(value)} {what} event handler name: give names like null,console")
    return tuple(names)


def read_events(values: FlagValues) -> EventSettings:
    """``--event-log-handler``, checked."""
    return EventSettings(parse_handler_list(values["event_log_handler"], values.source("event_log_handler")))


FLAGS: FlagGroup[EventSettings] = FlagGroup(
    name="events",
    title="events (where lifecycle events go)",
    read=read_events,
    flags=(
        Flag("--event-log-handler", default="null", torchrun=True,
             help="Event sink name, or a comma list of names (default null)."),
    ),
)
