"""The hang-detection flags, ``--hang-timeout`` (seconds, or ``auto``), ``--hang-watch`` and, for
``auto``, ``--hang-factor``, ``--hang-start-timeout`` and ``--hang-floor``: declared, parsed and
checked here.

:func:`read_hangs` gives one :class:`HangSettings`; the Python API's
:class:`~launcher.config.LaunchConfig` checks its ``hang_timeout`` and ``hang_watch`` fields with
the same parsers.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

from typing import Any, NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import parse_seconds, quote, read_float

__all__ = ["AUTO", "DEFAULT_FACTOR", "DEFAULT_FLOOR", "DEFAULT_START_TIMEOUT", "FLAGS", "WATCH_MODES",
           "HangSettings", "hang_settings", "parse_hang_timeout", "parse_hang_watch", "read_hangs"]

#: What counts as a sign of progress.
WATCH_MODES = ("heartbeat", "output")
#: The ``--hang-timeout`` value that learns the timeouts (docs/hangs.md, "Learned timeouts").
AUTO = "auto"
#: ``--hang-factor``: a learned timeout is this many times the longest interval seen.
DEFAULT_FACTOR = 5.0
#: ``--hang-start-timeout``: seconds from a worker's start to its first progress (imports,
#: compilation, data, the first communicators: often minutes).
DEFAULT_START_TIMEOUT = 600.0
#: ``--hang-floor``: the least learned timeout, in seconds.
DEFAULT_FLOOR = 60.0
#: The largest sensible ``--hang-factor``.
MAX_FACTOR = 1000.0


class HangSettings(NamedTuple):
    """Hang detection: off when ``timeout`` is ``None``."""

    #: Seconds a rank may go without progress before it is hung; with :attr:`auto`, the start
    #: timeout (what applies until a timeout is learned).
    timeout: float | None = None
    #: ``heartbeat`` (progress: launcher.heartbeat() calls, completed collectives, optimizer steps)
    #: or ``output`` (those or any output line).
    watch: str = "heartbeat"
    #: ``--hang-timeout auto``: the steady timeout is learned (:mod:`launcher.hangs.learning`).
    auto: bool = False
    #: ``--hang-factor`` (with :attr:`auto`).
    factor: float = DEFAULT_FACTOR
    #: ``--hang-floor`` (with :attr:`auto`): seconds.
    floor: float = DEFAULT_FLOOR

    @property
    def enabled(self) -> bool:
        return self.timeout is not None

    @property
    def watch_output(self) -> bool:
        """Whether any output line counts as progress, not only heartbeats."""
        return self.watch == "output"


def parse_hang_timeout(value: Any, name: str = "--hang-timeout") -> "float | str | None":
    """Seconds, :data:`AUTO`, or ``None`` when unset or empty (hang detection off).

    The command line's rules for every timeout (:func:`launcher.values.parse_seconds`): ASCII
    decimal (``300``, ``2.5``, ``1e3``), finite, above 0 and at most a week. ``name`` is how the
    user gave it (``--hang-timeout`` or ``PET_HANG_TIMEOUT``), for the message.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        return parse_seconds(value, name, zero=False)
    except UsageError:
        if isinstance(value, str) and not any(c.isdigit() for c in value):  # a word: say auto exists
            raise UsageError(f"{name} {quote(value)} is invalid: give seconds (e.g. 300) or auto "
                             "(learned timeouts)") from None
        raise  # a number out of range, or not a plain one: parse_seconds says which


def _factor(value: Any, name: str) -> float:
    number = read_float(value)
    if number is None or not 1.0 <= number <= MAX_FACTOR:
        raise UsageError(f"{name} {quote(str(value))} is invalid: give a number from 1 to {MAX_FACTOR:g} "
                         f"(default {DEFAULT_FACTOR:g})")
    return number


def hang_settings(timeout: Any = None, watch: Any = None, *, factor: Any = None, start_timeout: Any = None,
                  floor: Any = None, names: "tuple[str, str, str, str]" = (
                      "--hang-timeout", "--hang-factor", "--hang-start-timeout", "--hang-floor")) -> HangSettings:
    """The settings, checked as the flags are (``names``: how the user gave each, for messages).

    ``factor``, ``start_timeout`` and ``floor`` only mean something with ``timeout="auto"``:
    giving one without it is a :class:`UsageError` (a fixed timeout would silently ignore it).
    """
    parsed = parse_hang_timeout(timeout, names[0])
    watched = parse_hang_watch(watch)
    extra = [(value, name) for value, name in zip((factor, start_timeout, floor), names[1:], strict=True)
             if not (value is None or (isinstance(value, str) and not value.strip()))]
    if parsed != AUTO:
        if extra:
            raise UsageError(f"{extra[0][1]} only applies to learned timeouts: give --hang-timeout auto with it, "
                             f"or leave it out")
        return HangSettings(parsed if isinstance(parsed, float) else None, watched)
    given = dict((name, value) for value, name in extra)
    learned_factor = _factor(given[names[1]], names[1]) if names[1] in given else DEFAULT_FACTOR
    start = (parse_seconds(given[names[2]], names[2], zero=False) if names[2] in given
             else DEFAULT_START_TIMEOUT)
    least = parse_seconds(given[names[3]], names[3], zero=False) if names[3] in given else DEFAULT_FLOOR
    return HangSettings(start, watched, auto=True, factor=learned_factor, floor=least)


def parse_hang_watch(value: str | None) -> str:
    """``heartbeat`` (the default) or ``output``."""
    text = (value or "heartbeat").strip().lower()
    if text not in WATCH_MODES:
        raise UsageError(f"--hang-watch {value!r} is invalid: use heartbeat or output")
    return text


def read_hangs(values: FlagValues) -> HangSettings:
    """``--hang-timeout``, ``--hang-watch`` and the ``auto`` flags, checked."""
    return hang_settings(values["hang_timeout"], values["hang_watch"], factor=values["hang_factor"],
                         start_timeout=values["hang_start_timeout"], floor=values["hang_floor"],
                         names=(values.source("hang_timeout"), values.source("hang_factor"),
                                values.source("hang_start_timeout"), values.source("hang_floor")))


FLAGS: FlagGroup[HangSettings] = FlagGroup(
    name="hangs",
    title="hang detection",
    read=read_hangs,
    flags=(
        Flag("--hang-timeout", default=None,
             help="Seconds a rank may go without progress (a collective completed, an optimizer step, a "
             "launcher.heartbeat(); no code change needed) before it is hung: every rank's stack "
             "is printed and the group restarts like a failed one; or auto: learn the timeout from the "
             "job's own progress. A checkpoint (torch.save, torch.distributed.checkpoint) has a timeout of "
             "its own, and the ranks waiting for it are not hung (docs/hangs.md; default: off)."),
        Flag("--hang-watch", default="heartbeat",
             help="What counts as progress for --hang-timeout: heartbeat (default), or output (any output line too)."),
        Flag("--hang-factor", default=None,
             help=f"With --hang-timeout auto only: the learned timeout is this many times the longest interval "
             f"between a rank's progress seen after warm-up (default {DEFAULT_FACTOR:g})."),
        Flag("--hang-start-timeout", default=None,
             help=f"With --hang-timeout auto only: seconds from a worker's start to its first progress, and the "
             f"timeout until one is learned (default {DEFAULT_START_TIMEOUT:g})."),
        Flag("--hang-floor", default=None,
             help=f"With --hang-timeout auto only: the least learned timeout, in seconds "
             f"(default {DEFAULT_FLOOR:g})."),
    ),
)
