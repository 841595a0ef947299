"""The in-process view of a :class:`~launcher.store.server.StoreServer`'s data (for the agent).

It reaches the data only through the server's public :meth:`~launcher.store.server.StoreServer.locked`
and :meth:`~launcher.store.server.StoreServer.wait_keys`, so it needs no socket and never
touches the server's internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from launcher.store.protocol import as_bytes, encode_key

if TYPE_CHECKING:
    from launcher.store.server import StoreServer
    from launcher.store.table import KeyTable

__all__ = ["LocalStore"]


class LocalStore:
    """In-process :class:`~launcher.store.api.KeyValueStore` over a :class:`StoreServer`'s data.

    Get it from :attr:`StoreServer.store`. Keys live in the namespace torch's clients see:
    ``server.store.set("k", b"v")`` is what a worker's ``TCPStore.get("k")`` returns. Writes
    release remote clients waiting on the key. Blocking calls use ``timeout`` seconds when the
    call gives none (``None`` here: wait forever). :meth:`close` does nothing; the server owns
    the data. Safe to use from any number of threads.
    """

    def __init__(self, server: StoreServer, timeout: float | None = 300.0) -> None:
        self._server = server
        self.timeout = timeout

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``."""
        k, v = encode_key(key), as_bytes(value)
        self._server.locked(lambda t: t.set(k, v))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists."""
        k = encode_key(key)
        self._server.wait_keys([k], self._timeout(timeout))
        return self._server.locked(lambda t: t.get(k))

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (missing counts as 0); the new value."""
        k = encode_key(key)
        return self._server.locked(lambda t: t.add(k, int(amount)))

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and ``expected`` is
        empty). Returns the value now stored, except that for a missing key with a non-empty
        ``expected`` it returns ``expected`` (torch's server does the same)."""
        k, e, d = encode_key(key), as_bytes(expected), as_bytes(desired)
        return self._server.locked(lambda t: t.compare_set(k, e, d))

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Values of several keys, waiting until all exist."""
        ks = [encode_key(k) for k in keys]
        self._server.wait_keys(ks, self._timeout(timeout))
        return self._server.locked(lambda t: [t.get(k) for k in ks])

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set several keys at once."""
        if len(keys) != len(values):
            raise ValueError("multi_set needs as many values as keys")
        pairs = [(encode_key(k), as_bytes(v)) for k, v in zip(keys, values, strict=True)]

        def run(table: KeyTable) -> None:
            for k, v in pairs:
                table.set(k, v)

        self._server.locked(run)

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, without waiting."""
        ks = [encode_key(k) for k in keys]
        return self._server.locked(lambda t: all(t.present(k) for k in ks))

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key exists; :class:`StoreTimeoutError` after ``timeout`` seconds."""
        self._server.wait_keys([encode_key(k) for k in keys], self._timeout(timeout))

    def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        k = encode_key(key)
        return self._server.locked(lambda t: t.delete(k))

    def append(self, key: str, value: bytes) -> None:
        """Append ``value`` to the bytes at ``key`` (creating it)."""
        k, v = encode_key(key), as_bytes(value)
        self._server.locked(lambda t: t.append(k, v))

    def num_keys(self) -> int:
        """How many keys the server holds (all namespaces, as torch's ``num_keys`` reports)."""
        return self._server.locked(lambda t: t.num_keys())

    def close(self) -> None:
        """Nothing to release: the server owns the data."""
