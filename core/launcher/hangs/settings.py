"""The hang-detection settings: ``--hang-timeout`` and ``--hang-watch``, validated."""

from __future__ import annotations

from typing import Any

from launcher.errors import UsageError
from launcher.values import parse_seconds

#: What counts as a sign of progress.
WATCH_MODES = ("heartbeat", "output")


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
