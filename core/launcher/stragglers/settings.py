"""The straggler flags, ``--straggler-detection``, ``--straggler-threshold``, ``--straggler-action`` and
``--straggler-interval``: declared, parsed and checked here (``settings["stragglers"]``).

Off unless ``--straggler-detection`` (or ``PET_STRAGGLER_DETECTION=1``) is given: a plain command
line starts nothing new and puts nothing new in the workers' environment.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

import math
from typing import Any, NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import quote

__all__ = ["ACTIONS", "DEFAULT_INTERVAL", "DEFAULT_THRESHOLD", "FLAGS", "StragglerSettings", "monitor_for",
           "parse_straggler_action", "parse_straggler_interval", "parse_straggler_threshold", "read_stragglers",
           "straggler_settings"]

#: What happens to a straggler: ``report`` names it; ``exclude`` also puts its node out of the job
#: when a spare or the elastic range allows (docs/stragglers.md, "Exclusion").
ACTIONS = ("report", "exclude")

#: A rank is a straggler once its share of time outside collectives over the window is at least
#: this many times the median rank's. 1.15: an even job with 10% random noise per step on every
#: rank measures at most about 1.05 over a window of 20 steps (the window grows to hold 20), and a
#: rank whose compute is 30% slower measures 1.2 to 1.3 (less than 1.3 where the step also holds
#: work that is not slowed). See docs/stragglers.md.
DEFAULT_THRESHOLD = 1.15
#: Above this a "ratio" is surely a mistake (a percentage given as a ratio, say).
MAX_THRESHOLD = 100.0
#: Seconds between looks at the ranks' totals (and between the nodes' summaries in the store).
DEFAULT_INTERVAL = 5.0
MIN_INTERVAL = 0.2
MAX_INTERVAL = 3600.0


class StragglerSettings(NamedTuple):
    """Straggler detection: off unless ``enabled``."""

    enabled: bool = False
    #: Working-time ratio to the median rank at which a rank is named (see :data:`DEFAULT_THRESHOLD`).
    threshold: float = DEFAULT_THRESHOLD
    #: ``report`` or ``exclude``.
    action: str = "report"
    #: Seconds between samples; the verdict looks at the last few (``docs/stragglers.md``).
    interval: float = DEFAULT_INTERVAL


def _number(value: Any, name: str, what: str) -> float:
    text = str(value).strip()
    try:
        if not text.isascii():
            raise ValueError(text)
        number = float(text)
    except ValueError:
        raise UsageError(f"{name} {quote(str(value))} is not a number: {what}") from None
    if not math.isfinite(number):
        raise UsageError(f"{name} {quote(str(value))} is not a finite number: {what}")
    return number


def parse_straggler_threshold(value: Any, name: str = "--straggler-threshold") -> float:
    """A ratio above 1 and at most :data:`MAX_THRESHOLD` (``1.2``: 20% slower than the median rank)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return DEFAULT_THRESHOLD
    what = f"give a ratio above 1 and at most {MAX_THRESHOLD:g}, e.g. 1.2 for 20% slower than the median rank"
    number = _number(value, name, what)
    if number <= 1.0 or number > MAX_THRESHOLD:
        raise UsageError(f"{name} {quote(str(value))} is out of range: {what}")
    return number


def parse_straggler_interval(value: Any, name: str = "--straggler-interval") -> float:
    """Seconds between samples, from :data:`MIN_INTERVAL` to :data:`MAX_INTERVAL`."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return DEFAULT_INTERVAL
    what = f"give seconds from {MIN_INTERVAL:g} to {MAX_INTERVAL:g} (default {DEFAULT_INTERVAL:g})"
    number = _number(value, name, what)
    if number < MIN_INTERVAL or number > MAX_INTERVAL:
        raise UsageError(f"{name} {quote(str(value))} is out of range: {what}")
    return number


def parse_straggler_action(value: Any, name: str = "--straggler-action") -> str:
    """``report`` (the default) or ``exclude``."""
    text = "report" if value is None else str(value).strip().lower()
    if text not in ACTIONS:
        raise UsageError(f"{name} {quote(str(value))} is not an action: use report or exclude")
    return text


def straggler_settings(enabled: bool = True, threshold: Any = None, action: Any = None, interval: Any = None, *,
                       names: "tuple[str, str, str]" = ("--straggler-threshold", "--straggler-action",
                                                        "--straggler-interval")) -> StragglerSettings:
    """The settings, checked as the flags are; the Python API's way:
    ``LaunchConfig(settings={"stragglers": straggler_settings(threshold=1.3)})``."""
    return StragglerSettings(bool(enabled), parse_straggler_threshold(threshold, names[0]),
                             parse_straggler_action(action, names[1]), parse_straggler_interval(interval, names[2]))


def read_stragglers(values: FlagValues) -> StragglerSettings:
    """``--straggler-*``, checked (also when detection is off: a typo is an error either way)."""
    return straggler_settings(bool(values["straggler_detection"]), values["straggler_threshold"],
                              values["straggler_action"], values["straggler_interval"],
                              names=(values.source("straggler_threshold"), values.source("straggler_action"),
                                     values.source("straggler_interval")))


FLAGS: FlagGroup[StragglerSettings] = FlagGroup(
    name="stragglers",
    title="straggler detection",
    read=read_stragglers,
    flags=(
        Flag("--straggler-detection", switch=True,
             help="Name, while the job runs, the rank that makes the others wait in their collectives (a slow GPU, "
             "NIC, disk or data loader): each rank's collectives are timed, no code change (docs/stragglers.md)."),
        Flag("--straggler-threshold", default=None,
             help=f"A rank is a straggler once its time outside collectives is this many times the median rank's "
             f"(default {DEFAULT_THRESHOLD:g}: 15%% slower)."),
        Flag("--straggler-action", default=None,
             help="What happens to a straggler: report (default) prints one line naming it and emits "
             "straggler_detected; exclude also puts its node out of the job when a spare waits or the job keeps "
             "at least its MIN nodes (docs/stragglers.md)."),
        Flag("--straggler-interval", default=None,
             help=f"Seconds between looks at every rank's timings and between the nodes' summaries in the store "
             f"(default {DEFAULT_INTERVAL:g})."),
    ),
)


class _NoMonitor:
    """Detection off: :meth:`attach` leaves the workers as they are."""

    #: Detection is off (``launcher status`` shows no slow ranks and no step rates).
    enabled = False

    def attach(self, envs: Any, group: Any, info: Any, *, kept: bool = False) -> None:
        return None

    def act(self, handler: Any, info: Any) -> None:
        return None

    def before_join(self, handler: Any) -> None:
        return None

    def after_join(self, handler: Any) -> None:
        return None


def monitor_for(plan: Any, emit: Any, stack: Any) -> Any:
    """The agent's :class:`~launcher.stragglers.monitor.StragglerMonitor` for ``plan`` (closed with
    ``stack``), or one that does nothing when ``plan.settings["stragglers"]`` does not turn
    detection on: then nothing is imported and the workers' environment is left as it was."""
    settings = plan.settings.get("stragglers")
    if settings is None or not settings.enabled:
        return _NoMonitor()
    from launcher.stragglers.monitor import StragglerMonitor

    monitor = StragglerMonitor(settings, node=plan.node, run_id=plan.run_id, emit=emit)
    stack.callback(monitor.close)
    return monitor
