"""The agent's side of a file of fixed-size slots that the workers write into.

Hang detection (:mod:`launcher.hangs.watch`) and straggler detection
(:mod:`launcher.stragglers.slots`) each give every local worker one slot of such a file: the
worker maps its slot and stores into it without a lock or a system call; the agent creates the
file zeroed before the workers start, maps it read-only and reads consistent copies of it. Each
subclass decodes its own layout.
"""

from __future__ import annotations

import contextlib
import mmap
import os

from launcher.hangs.heartbeat import stable_copy

__all__ = ["SlotTable"]


class SlotTable:
    """``count`` zeroed slots of ``slot_size`` bytes in a new file at ``path``, mapped read-only."""

    def __init__(self, path: str, count: int, slot_size: int) -> None:
        self.path = path
        self.count = count
        self.slot_size = slot_size
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, max(1, count) * slot_size)
            self._page = mmap.mmap(fd, max(1, count) * slot_size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)

    def copy(self) -> bytes:
        """Every slot, from one consistent copy of the file (see :func:`~launcher.hangs.heartbeat.stable_copy`)."""
        return stable_copy(self._page, 0, self.count * self.slot_size)

    def close(self) -> None:
        """Unmap and remove the file."""
        with contextlib.suppress(BufferError, ValueError):
            self._page.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
