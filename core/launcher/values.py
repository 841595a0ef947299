"""Reading user-given values: ASCII numbers within a stated range, and quoting values in messages.

Every number the launcher accepts (flags, ``PET_*`` variables, ``--rdzv-conf`` values, the Python
API's :class:`~launcher.config.LaunchConfig` fields) goes through :func:`parse_int` or
:func:`parse_seconds`, so a value is accepted or refused the same way wherever it comes from, and
every refusal names the accepted range. Only plain ASCII decimal counts: Python's ``int()`` and
``str.isdigit()`` also take ``"٣"``, ``"²"``, ``"1_0"``, ``"+2"`` or ``" 2\n"``, which no user
means as a worker count. So no sign, no ``_`` separators and no surrounding whitespace: a value
that is refused here is refused everywhere (a negative number is refused by its range).
"""

from __future__ import annotations

import math
import re
from typing import Any

from launcher.errors import UsageError

__all__ = [
    "MAX_NODES",
    "MAX_NPROC",
    "MAX_RESTARTS",
    "MAX_SECONDS",
    "one_line",
    "parse_int",
    "parse_seconds",
    "quote",
    "read_float",
    "read_int",
]

#: Upper bounds: far above any real job, low enough that a typo fails at once instead of
#: spawning for minutes or overflowing a timer.
MAX_NPROC = 4096
MAX_NODES = 100_000
MAX_RESTARTS = 100_000
#: One week: the longest timeout any setting accepts.
MAX_SECONDS = 604_800

# [0-9] rather than \d: \d matches every Unicode decimal digit. A leading "-" is read (so that
# "-1" is refused by the range, which the message states); "+", "_" and whitespace are not.
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: Longer numbers are refused before conversion (int() of 5000 digits is an error of its own).
_MAX_CHARS = 40
_QUOTE_LIMIT = 80


def quote(value: Any) -> str:
    """``value`` quoted for an error message: control characters escaped, long values shortened.

    The result never contains a line break, so a message that quotes user input stays one line.
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) > _QUOTE_LIMIT:
        return repr(text[: _QUOTE_LIMIT - 3]) + "..."
    return repr(text)


def one_line(message: str) -> str:
    """``message`` with every non-printable character (line breaks included) escaped."""
    if message.isprintable():
        return message
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message)


def _text(value: Any) -> str | None:
    """The string to parse, or ``None`` when ``value`` is not text."""
    if not isinstance(value, str):
        return None
    return value if len(value) <= _MAX_CHARS else None


def read_int(value: Any) -> int | None:
    """``value`` (an ``int`` or ASCII decimal text) as an integer; ``None`` if it is neither."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = _text(value)
    if text is not None and _INT.fullmatch(text):
        return int(text)
    return None


def read_float(value: Any) -> float | None:
    """``value`` (a number or ASCII decimal text, ``1.5``, ``2e3``) as a finite float, else ``None``."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        text = _text(value)
        if text is not None and _FLOAT.fullmatch(text):
            number = float(text)
    return number if number is not None and math.isfinite(number) else None


def parse_int(value: Any, name: str, low: int, high: int) -> int:
    """``value`` (an ``int`` or ASCII decimal text) as an integer from ``low`` to ``high``.

    Raises :class:`UsageError` naming ``name`` and the range otherwise.
    """
    number = read_int(value)
    if number is None or not low <= number <= high:
        raise UsageError(f"{name} must be an integer from {low} to {high}, got {quote(value)}")
    return number


def parse_seconds(value: Any, name: str, high: float = MAX_SECONDS, *, zero: bool = True,
                  low: float = 0.0) -> float:
    """``value`` (a number or ASCII decimal text, ``1.5`` or ``2e3``) as finite seconds.

    The range is ``low`` to ``high``; with ``zero=False`` the value must be above ``low``.
    Raises :class:`UsageError` naming ``name`` and the range otherwise.
    """
    number = read_float(value)
    in_range = number is not None and (
        (low <= number if zero else low < number) and number <= high
    )
    if not in_range:
        bound = f"from {_num(low)} to {_num(high)}" if zero else f"above {_num(low)} and at most {_num(high)}"
        raise UsageError(f"{name} must be a number of seconds {bound}, got {quote(value)}")
    assert number is not None
    return number


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
