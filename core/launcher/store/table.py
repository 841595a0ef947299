"""The store's data: keys, queues, and who is waiting for which key, with torch's semantics.

Not thread-safe by itself: :class:`~launcher.store.server.StoreServer` calls it with its lock
held, from the serving thread and from :class:`~launcher.store.local.LocalStore` callers. Keys
are raw bytes exactly as clients send them (torch's ``/`` prefix included).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Final

from launcher.store.protocol import parse_int

__all__ = ["KeyTable", "Waiter"]

_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1


class Waiter:
    """Someone (``owner``, a connection) blocked in WAIT or BARRIER, and the keys it still needs."""

    __slots__ = ("missing", "owner")

    def __init__(self, owner: object, missing: set[bytes]) -> None:
        self.owner = owner
        self.missing = missing


class KeyTable:
    """Keys and queues, and the waiters they release.

    ``release(waiter)`` is called when a waiter's last missing key appears; ``written()`` after
    every write (the server wakes in-process waiters from it).
    """

    def __init__(self, release: Callable[[Waiter], None], written: Callable[[], None]) -> None:
        self._release = release
        self._written = written
        self.kv: dict[bytes, bytes] = {}
        self.queues: dict[bytes, deque[bytes]] = {}
        # key -> waiters blocked on it, in arrival order (dict: O(1) removal on cancel).
        self._waiting: dict[bytes, dict[int, Waiter]] = {}

    # ------------------------------------------------------------------ reads

    def present(self, key: bytes) -> bool:
        """Whether ``key`` exists; a non-empty queue counts, as in torch's WAIT and CHECK."""
        return key in self.kv or bool(self.queues.get(key))

    def get(self, key: bytes) -> bytes:
        """The value of ``key``; empty when missing (like torch's server)."""
        return self.kv.get(key, b"")

    def num_keys(self) -> int:
        return len(self.kv)

    def queue_len(self, key: bytes) -> int:
        return len(self.queues.get(key, ()))

    # ------------------------------------------------------------------ writes

    def set(self, key: bytes, value: bytes) -> None:
        self.kv[key] = value
        self._key_ready(key)

    def compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        current = self.kv.get(key)
        if current is None:
            if expected:
                # torch's server answers with `expected` here although nothing is stored;
                # clients compare the answer with `desired`, so the swap reads as failed.
                return expected
            self.set(key, desired)
            return desired
        if current == expected:
            self.set(key, desired)
            return desired
        return current

    def add(self, key: bytes, amount: int) -> int:
        """Add to the decimal integer at ``key``; :class:`ValueError` when it is not one or overflows."""
        current = self.kv.get(key)
        total = amount + (parse_int(current) if current is not None else 0)
        if not _I64_MIN <= total <= _I64_MAX:
            raise ValueError(f"adding {amount} overflows a signed 64-bit integer")
        self.set(key, str(total).encode())
        return total

    def append(self, key: bytes, value: bytes) -> None:
        self.set(key, self.kv.get(key, b"") + value)

    def delete(self, key: bytes) -> bool:
        return self.kv.pop(key, None) is not None

    def discard(self, keep: tuple[bytes, ...]) -> int:
        """Delete every key not starting with one of ``keep``; how many went."""
        doomed = [key for key in self.kv if not key.startswith(keep)] if keep else list(self.kv)
        for key in doomed:
            del self.kv[key]
        return len(doomed)

    def barrier(self, key: bytes, world_size: int) -> bool:
        """Count one arrival at ``key`` (a decimal string); whether all ``world_size`` are in
        (then everyone waiting on ``key`` is released)."""
        current = self.kv.get(key)
        count = (parse_int(current) if current is not None else 0) + 1
        self.kv[key] = str(count).encode()
        if count >= world_size:
            self._key_ready(key)
            return True
        return False

    def queue_push(self, key: bytes, value: bytes) -> None:
        self.queues.setdefault(key, deque()).append(value)
        self._queue_ready(key)

    def queue_pop(self, key: bytes) -> tuple[int, bytes | None]:
        """The queue's length before the pop, and the oldest item (``None`` when empty)."""
        queue = self.queues.get(key)
        if not queue:
            return 0, None
        length = len(queue)
        item = queue.popleft()
        if not queue:
            del self.queues[key]
        return length, item

    # ------------------------------------------------------------------ waiting

    def wait(self, owner: object, keys: Iterable[bytes], *, next_write: bool = False) -> Waiter | None:
        """Register ``owner`` as waiting for the missing ones of ``keys``; ``None`` when all
        exist. With ``next_write``, wait for the next write of every key, present or not (a
        barrier's arrivals wait on the count key that they have just written)."""
        missing = set(keys) if next_write else {k for k in keys if not self.present(k)}
        if not missing:
            return None
        waiter = Waiter(owner, missing)
        for key in missing:
            self._waiting.setdefault(key, {})[id(waiter)] = waiter
        return waiter

    def cancel(self, waiter: Waiter) -> None:
        """Forget ``waiter`` (its owner stopped waiting or went away)."""
        for key in waiter.missing:
            waiters = self._waiting.get(key)
            if waiters is not None:
                waiters.pop(id(waiter), None)
                if not waiters:
                    del self._waiting[key]

    def _key_ready(self, key: bytes) -> None:
        """``key`` was written: release every waiter that needed only it."""
        waiters = self._waiting.pop(key, None)
        if waiters:
            for waiter in waiters.values():
                waiter.missing.discard(key)
                if not waiter.missing:
                    self._release(waiter)
        self._written()

    def _queue_ready(self, key: bytes) -> None:
        """One item was pushed onto queue ``key``: release at most one waiter, since only one
        pop can get the item."""
        waiters = self._waiting.get(key)
        while waiters:
            waiter = waiters.pop(next(iter(waiters)))
            waiter.missing.discard(key)
            if not waiter.missing:
                self._release(waiter)
                break
        if waiters is not None and not waiters:
            del self._waiting[key]
        self._written()
