"""The key-value store interface the core's rendezvous and agent use.

Values are bytes; keys are strings. Blocking calls take a timeout in seconds and raise
:class:`StoreTimeoutError` when it passes. An implementation must be safe to call from one thread
at a time; the rendezvous shares one client between its threads (the handler, its heartbeats and
the agent's round store), which take turns under one lock and never hold it for a long wait
(:mod:`launcher.rendezvous.store_ops`).

Implementations in this package, each module with one job (all standard library only):

* :mod:`launcher.store.protocol`: torch's TCPStore wire protocol, the codec server and client share.
* :mod:`launcher.store.table`: the server's data (keys, queues, waiters) with torch's semantics.
* :mod:`launcher.store.requests`: one client connection and the requests it sends, executed
  against the table.
* :mod:`launcher.store.loop`: the server's serving thread (accept, admit, read, execute, write).
* :mod:`launcher.store.server`: :class:`~launcher.store.server.StoreServer`, the public face of
  the server (lifecycle, addresses, admission, in-process access).
* :mod:`launcher.store.local`: :class:`~launcher.store.local.LocalStore`, the in-process view of
  a server's data that the agent uses, without a socket.
* :mod:`launcher.store.client`: :class:`~launcher.store.client.TCPStoreClient`, a blocking
  client for our server and torch's; :mod:`launcher.store.connection` opens its connections
  (retry, handshake, authentication).
* :mod:`launcher.store.admission`: who may connect (address ranges, members, a shared secret).
* :mod:`launcher.store.throttle`: rate-limited logging of trouble caused by peers.

Outside this package, ``launcher.rendezvous.torch_store`` adapts a torch ``Store`` to this
interface, and store plugins (``launcher-etcd``) provide their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


class StoreError(Exception):
    """The store could not be reached or answered with an error."""


class StoreTimeoutError(StoreError, TimeoutError):
    """A blocking store call did not complete within its timeout."""


class StoreConnectionError(StoreError):
    """The connection broke during a call (the server closed or reset it): the request may or
    may not have run. The next call reconnects."""


@runtime_checkable
class KeyValueStore(Protocol):
    """Operations the rendezvous algorithm needs from a backend's store."""

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``."""

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists."""

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (missing counts as 0); the new value."""

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and ``expected`` is
        empty); return the value now stored.

        As torch's TCPStore does, a missing key with a non-empty ``expected`` stores nothing and
        returns ``expected``: compare the result with ``desired`` to know whether the swap
        happened.
        """

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Values of several keys, waiting until all exist."""

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set several keys at once."""

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, without waiting."""

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key exists."""

    def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""

    def close(self) -> None:
        """Release the connection."""
