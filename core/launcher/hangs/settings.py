"""The hang-detection flags, ``--hang-timeout`` and ``--hang-watch``: declared, parsed and checked here.

:func:`read_hangs` gives one :class:`HangSettings`; the Python API's
:class:`~launcher.config.LaunchConfig` checks its ``hang_timeout`` and ``hang_watch`` fields with
the same parsers.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

from typing import Any, NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import parse_seconds

__all__ = ["FLAGS", "WATCH_MODES", "HangSettings", "parse_hang_timeout", "parse_hang_watch", "read_hangs"]

#: What counts as a sign of progress.
WATCH_MODES = ("heartbeat", "output")


class HangSettings(NamedTuple):
    """Hang detection: off when ``timeout`` is ``None``."""

    #: Seconds a rank may go without progress before it is hung.
    timeout: float | None = None
    #: ``heartbeat`` (progress: launcher.heartbeat() calls, completed collectives, optimizer steps)
    #: or ``output`` (those or any output line).
    watch: str = "heartbeat"

    @property
    def enabled(self) -> bool:
        return self.timeout is not None

    @property
    def watch_output(self) -> bool:
        """Whether any output line counts as progress, not only heartbeats."""
        return self.watch == "output"


def parse_hang_timeout(value: Any, name: str = "--hang-timeout") -> float | None:
    """Seconds, or ``None`` when unset or empty (hang detection off).

    The command line's rules for every timeout (:func:`launcher.values.parse_seconds`): ASCII
    decimal (``300``, ``2.5``, ``1e3``), finite, above 0 and at most a week. ``name`` is how the
    user gave it (``--hang-timeout`` or ``PET_HANG_TIMEOUT``), for the message.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_seconds(value, name, zero=False)


def parse_hang_watch(value: str | None) -> str:
    """``heartbeat`` (the default) or ``output``."""
    text = (value or "heartbeat").strip().lower()
    if text not in WATCH_MODES:
        raise UsageError(f"--hang-watch {value!r} is invalid: use heartbeat or output")
    return text


def read_hangs(values: FlagValues) -> HangSettings:
    """``--hang-timeout`` and ``--hang-watch``, checked."""
    return HangSettings(parse_hang_timeout(values["hang_timeout"], values.source("hang_timeout")),
                        parse_hang_watch(values["hang_watch"]))


FLAGS: FlagGroup[HangSettings] = FlagGroup(
    name="hangs",
    title="hang detection",
    read=read_hangs,
    flags=(
        Flag("--hang-timeout", default=None,
             help="Seconds a rank may go without progress (a collective completed, an optimizer step, a "
             "launcher.heartbeat(); no code change needed) before it is hung: every rank's stack "
             "is printed and the group restarts like a failed one (default: off)."),
        Flag("--hang-watch", default="heartbeat",
             help="What counts as progress for --hang-timeout: heartbeat (default), or output (any output line too)."),
    ),
)
