"""The hang-detection settings: ``--hang-timeout`` and ``--hang-watch``, validated."""

from __future__ import annotations

import math

from launcher.errors import UsageError

#: What counts as a sign of progress.
WATCH_MODES = ("heartbeat", "output")


def parse_hang_timeout(value: str | float | None) -> float | None:
    """Seconds (ASCII digits, finite, > 0), or ``None`` when unset or empty (hang detection off)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
        text = repr(value)
    else:
        text = str(value).strip()
        if not text:
            return None
        # float() accepts non-ASCII digits, "inf", "nan" and "1_0": a timeout is plain ASCII.
        if not text.isascii() or "_" in text:
            raise UsageError(f"--hang-timeout {value!r} is invalid: use a number of seconds, e.g. 300")
        try:
            number = float(text)
        except ValueError:
            raise UsageError(f"--hang-timeout {value!r} is invalid: use a number of seconds, e.g. 300") from None
    if not math.isfinite(number) or number <= 0:
        raise UsageError(f"--hang-timeout {text} is invalid: use a positive, finite number of seconds, e.g. 300")
    return number


def parse_hang_watch(value: str | None) -> str:
    """``heartbeat`` (the default) or ``output``."""
    text = (value or "heartbeat").strip().lower()
    if text not in WATCH_MODES:
        raise UsageError(f"--hang-watch {value!r} is invalid: use heartbeat or output")
    return text
