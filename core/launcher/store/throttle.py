"""Rate-limited logging: one line per (peer, kind of event) per interval, with a count of the rest.

A hostile or broken client can fail validation thousands of times a second; logging each
failure would fill the agent's log and cost more than the failure itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from typing import Final

__all__ = ["LogThrottle"]

# Forget quiet peers once this many are tracked, so a scan from many addresses cannot grow the
# table without bound.
_MAX_ENTRIES: Final = 4096


class LogThrottle:
    """Log at most once per ``interval`` seconds for each key, counting what it holds back.

    The next line for a key says how many similar messages were suppressed since the last one.
    Not thread-safe on its own: the store server calls it with its lock held.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self.interval = interval
        self._clock = clock
        # key -> [time of the last line, messages suppressed since]
        self._entries: dict[Hashable, list[float]] = {}

    def log(self, level: int, key: Hashable, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``key`` was logged within the interval; whether it was."""
        now = self._clock()
        entry = self._entries.get(key)
        if entry is not None and now - entry[0] < self.interval:
            entry[1] += 1
            return False
        suppressed = int(entry[1]) if entry is not None else 0
        if entry is None and len(self._entries) >= _MAX_ENTRIES:
            self._prune(now)
        self._entries[key] = [now, 0]
        if suppressed:
            msg += " (%d similar messages suppressed in the last %.0f s)"
            args = (*args, suppressed, now - entry[0] if entry else self.interval)
        self._log.log(level, msg, *args)
        return True

    def _prune(self, now: float) -> None:
        stale = [k for k, (at, _) in self._entries.items() if now - at >= self.interval]
        for key in stale:
            del self._entries[key]
        if len(self._entries) >= _MAX_ENTRIES:  # all recent: drop the oldest half
            for key in list(self._entries)[: _MAX_ENTRIES // 2]:
                del self._entries[key]
