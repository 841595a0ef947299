"""The rendezvous's use of its store connection: one call at a time, waits cut into slices.

One connection serves a handler's calls, its heartbeats and the agent's round store, so every
call takes one lock (:class:`StoreOps`), and a blocking wait is cut into slices of at most
:data:`WAIT_SLICE` seconds (longer in rounds of thousands of nodes: :func:`wait_slice_for`) so
that none of them locks the others out for long.
:class:`RoundStore` is the agent's view of that connection: the keys of one round. Its waits
(the exit barrier, rank assignment, failure reports) run while the heartbeat thread beats, so
they hold the lock for no blocking call at all: they poll with ``check`` and sleep between
checks with the lock released (:func:`poll_until`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from launcher.rendezvous.api import RendezvousClosedError, RendezvousError, RendezvousStoreError
from launcher.store.api import KeyValueStore, StoreConnectionError, StoreError, StoreTimeoutError
from launcher.store.connection import JobEnded

__all__ = [
    "JobEndedForSpare",
    "POLL_MAX",
    "WAIT_SLICE",
    "ConnectionLost",
    "RoundStore",
    "StoreOps",
    "poll_until",
    "wait_in_slices",
    "wait_slice_for",
]


class JobEndedForSpare(RendezvousClosedError):
    """The store told this node, which it had refused as a spare, that the job has ended: the
    node waited only as a spare (the agent exits 0, see "Spares" in docs/rendezvous.md)."""

T = TypeVar("T")

#: Longest single blocking wait on the shared connection, in seconds (rounds of up to
#: :data:`WAITS_PER_SECOND` nodes; larger ones wait longer, see :func:`wait_slice_for`).
WAIT_SLICE = 1.0
#: Slices that the waiting nodes of a round end, together, per second at most (each costs the
#: store's host a cancel and a new wait): beyond this many nodes, each node's slices lengthen.
WAITS_PER_SECOND = 1024
#: The longest slice a large round gets, in seconds.
MAX_WAIT_SLICE = 4.0


def wait_slice_for(max_nodes: int, keep_alive_interval: float, liveness_timeout: float) -> float:
    """The slice length for a round of up to ``max_nodes`` nodes.

    Each slice that ends without the key costs the store's host a cancel and a new wait, so N
    waiting nodes cost N per slice length: the slices grow with the round (1 s up to 1,024
    nodes, 4 s at 4,096), keeping those re-waits near :data:`WAITS_PER_SECOND`. A slice holds
    the connection that the heartbeat shares, so it stays short enough for a delayed beat to
    land well within the liveness timeout.
    """
    heartbeat_room = (liveness_timeout - keep_alive_interval) / 2
    return max(WAIT_SLICE, min(max_nodes / WAITS_PER_SECOND, MAX_WAIT_SLICE, heartbeat_room))
#: Longest pause between two checks of :func:`poll_until`, in seconds.
POLL_MAX = 0.2


def poll_until(check: Callable[[], bool], timeout: float) -> bool:
    """Call ``check`` until it is true or ``timeout`` seconds have passed; its last answer.

    Pauses 10 ms after the first check, doubling up to :data:`POLL_MAX`; the caller holds no
    lock while it sleeps, so another thread of the same connection (the heartbeat) never waits
    for more than one check.
    """
    end = time.monotonic() + max(timeout, 0.0)
    pause = 0.01
    while True:
        if check():
            return True
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, POLL_MAX)


def wait_in_slices(
    wait: Callable[[list[str], float], Any],
    check: Callable[[list[str]], bool],
    keys: list[str],
    timeout: float,
    slice_s: float = WAIT_SLICE,
) -> bool:
    """Wait up to ``timeout`` seconds for ``keys`` with ``wait`` calls of at most ``slice_s``
    seconds each (a slice that times out raises StoreTimeoutError); whether they all exist.

    Once the time is up, ``check`` gives the answer.
    """
    end = time.monotonic() + max(timeout, 0.0)
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return check(keys)
        try:
            wait(keys, min(left, slice_s))
            return True
        except StoreTimeoutError:
            continue


class ConnectionLost(RendezvousStoreError):
    """The store closed this node's connection during a call (the request may or may not have
    run): a closed round's c10d store cuts off nodes that are not its members, spares included."""


class StoreOps:
    """The store calls of one handler: one at a time (a lock), failures as RendezvousError."""

    def __init__(self, store: KeyValueStore, run_id: str, read_timeout: float) -> None:
        self.store = store
        self.lock = threading.RLock()
        self.run_id = run_id
        self.read_timeout = read_timeout
        #: Longest single blocking wait (:func:`wait_slice_for` the round's size).
        self.wait_slice = WAIT_SLICE

    def call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` under the lock; a store failure becomes a RendezvousError naming ``what``."""
        with self.lock:
            try:
                return fn(*args)
            except StoreTimeoutError:
                if what == "wait":  # a wait that times out is an answer, handled by the caller
                    raise
                raise RendezvousError(
                    f"rendezvous {self.run_id!r}: the store did not answer a {what} within "
                    f"{self.read_timeout:g} s (read_timeout)"
                ) from None
            except JobEnded as exc:
                # A spare cut off from a closed round's store, then told by it the job has ended.
                raise JobEndedForSpare(f"rendezvous {self.run_id!r} is closed: {exc}") from None
            except StoreConnectionError as exc:
                raise ConnectionLost(f"rendezvous {self.run_id!r}: the store failed during {what}: {exc}") from None
            except StoreError as exc:
                raise RendezvousStoreError(
                    f"rendezvous {self.run_id!r}: the store failed during {what}: {exc}"
                ) from None

    def raw(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` under the lock, store errors unchanged (for the agent's round store)."""
        with self.lock:
            return fn(*args)

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter at ``key``; the new value."""
        return self.call("add", self.store.add, key, amount)

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``."""
        self.call("set", self.store.set, key, value)

    def get(self, key: str) -> bytes:
        """The value of ``key``, which must appear within the read timeout."""
        if not self.wait([key], self.read_timeout):
            raise RendezvousError(
                f"rendezvous {self.run_id!r}: the store key {key!r} did not appear within "
                f"{self.read_timeout:g} s (read_timeout): the node that writes it may have died"
            )
        return self.call("get", self.store.get, key, self.read_timeout)

    def get_present(self, key: str) -> bytes:
        """The value of ``key``, known to exist already (written before a key this node waited
        for): one request, no wait first."""
        return self.call("get", self.store.get, key, self.read_timeout)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected``; the value now stored."""
        return self.call("compare_set", self.store.compare_set, key, expected, desired)

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set several keys in one request."""
        self.call("multi_set", self.store.multi_set, list(keys), list(values))

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, without waiting."""
        return self.call("check", self.store.check, list(keys))

    def multi_get(self, keys: Sequence[str], timeout: float) -> list[bytes]:
        """Values of ``keys`` once all exist; StoreTimeoutError after ``timeout`` seconds."""
        if not self.wait(keys, timeout):
            raise StoreTimeoutError(f"keys did not appear within {timeout:g} s")
        return self.call("multi_get", self.store.multi_get, list(keys), self.read_timeout)

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``keys``; whether they all exist."""

        def wait_slice(names: list[str], seconds: float) -> None:
            self.call("wait", self.store.wait, names, seconds)

        return wait_in_slices(wait_slice, self.check, list(keys), timeout, self.wait_slice)


class RoundStore:
    """The store handed to the agent: a key prefix per round, sharing the handler's connection.

    Waits poll with ``check`` (:func:`poll_until`) rather than block on the connection, so that
    the heartbeat thread, which shares it, keeps beating while the agent waits at its exit
    barrier, however loaded the machine is.
    """

    def __init__(self, ops: StoreOps, prefix: str) -> None:
        self._ops = ops
        self.prefix = prefix

    def _k(self, key: str) -> str:
        return self.prefix + key

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``."""
        self._ops.raw(self._ops.store.set, self._k(key), value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists."""
        self.wait([key], timeout)
        return self._ops.raw(self._ops.store.get, self._k(key), self._ops.read_timeout)

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key``; the new value."""
        return self._ops.raw(self._ops.store.add, self._k(key), amount)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected``; the value now stored."""
        return self._ops.raw(self._ops.store.compare_set, self._k(key), expected, desired)

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Values of several keys, waiting until all exist."""
        self.wait(keys, timeout)
        return self._ops.raw(self._ops.store.multi_get, [self._k(k) for k in keys], self._ops.read_timeout)

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set several keys at once."""
        self._ops.raw(self._ops.store.multi_set, [self._k(k) for k in keys], list(values))

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, without waiting."""
        return self._ops.raw(self._ops.store.check, [self._k(k) for k in keys])

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key exists (``timeout`` ``None``: the read timeout)."""
        limit = self._ops.read_timeout if timeout is None else timeout
        store = self._ops.store
        names = [self._k(k) for k in keys]
        if not poll_until(lambda: bool(self._ops.raw(store.check, names)), limit):
            raise StoreTimeoutError(f"keys {list(keys)} did not appear within {limit:g} s")

    def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        return self._ops.raw(self._ops.store.delete, self._k(key))

    def close(self) -> None:
        """Nothing to release: the connection belongs to the handler."""
