"""A :class:`~launcher.store.api.KeyValueStore` over a ``torch.distributed.Store``.

This module never imports torch itself: it receives a store object (TCPStore, FileStore,
PrefixStore) created elsewhere and only translates calls and errors. torch raises
``DistStoreError`` for both "timed out" and "failed"; the message is the only way to tell them
apart, so timeouts are recognised by it and become :class:`~launcher.store.api.StoreTimeoutError`.

A wait with a timeout polls ``check`` (with backoff) instead of calling torch's ``wait``: torch's
client logs two C++ warnings to stderr every time a wait times out, and the rendezvous waits in
short slices, which would flood the agent's console.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from launcher.store.api import StoreError, StoreTimeoutError

T = TypeVar("T")

__all__ = ["TorchStore"]


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or "timeout" in str(exc).lower() or "timed out" in str(exc).lower()


class TorchStore:
    """Adapts a torch ``Store`` to launcher's :class:`~launcher.store.api.KeyValueStore`.

    ``on_close`` runs once on :meth:`close`. A timed wait checks at once, then after
    ``poll_min`` seconds, doubling the pause up to ``poll_max``: waits that end quickly end
    quickly, and a thousand nodes waiting for a slow round cost the server a few checks a second
    each.
    """

    def __init__(
        self,
        store: Any,
        *,
        on_close: Callable[[], None] | None = None,
        poll_min: float = 0.02,
        poll_max: float = 0.2,
    ) -> None:
        self.torch_store = store
        self._on_close = on_close
        self.poll_min = poll_min
        self.poll_max = poll_max

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (RuntimeError, ValueError, TimeoutError, OSError) as exc:
            # torch's messages are long C++ dumps; keep their first line only.
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if _is_timeout(exc):
                raise StoreTimeoutError(f"store {what} timed out: {text}") from None
            raise StoreError(f"store {what} failed: {text}") from None

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``."""
        self._call("set", lambda: self.torch_store.set(key, value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists (at most ``timeout`` seconds)."""
        if timeout is not None:
            self.wait([key], timeout)
        return bytes(self._call("get", lambda: self.torch_store.get(key)))

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key``; the new value."""
        return int(self._call("add", lambda: self.torch_store.add(key, amount)))

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and ``expected`` is empty)."""
        return bytes(self._call("compare_set", lambda: self.torch_store.compare_set(key, expected, desired)))

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Values of several keys, waiting until all exist."""
        if not keys:
            return []
        if timeout is not None:
            self.wait(keys, timeout)
        return [bytes(v) for v in self._call("multi_get", lambda: self.torch_store.multi_get(list(keys)))]

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set several keys at once."""
        if keys:
            self._call("multi_set", lambda: self.torch_store.multi_set(list(keys), list(values)))

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, without waiting."""
        return bool(self._call("check", lambda: self.torch_store.check(list(keys))))

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key exists (at most ``timeout`` seconds, else the store's own timeout)."""
        names = list(keys)
        if timeout is None:
            self._call("wait", lambda: self.torch_store.wait(names))
            return
        end = time.monotonic() + timeout
        pause = self.poll_min
        while not self.check(names):
            left = end - time.monotonic()
            if left <= 0:
                raise StoreTimeoutError(f"store wait timed out after {timeout:g} s for keys {names[:4]}")
            time.sleep(min(pause, left))
            pause = min(pause * 2, self.poll_max)

    def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        return bool(self._call("delete", lambda: self.torch_store.delete_key(key)))

    def close(self) -> None:
        """Drop the torch store (its connection closes with it) and run ``on_close`` once."""
        callback, self._on_close = self._on_close, None
        self.torch_store = None
        if callback is not None:
            callback()
