"""A blocking TCPStore client in pure Python.

:class:`TCPStoreClient` speaks torch's TCPStore wire protocol (see ``docs/store.md``), so it
works against launcher's own :class:`~launcher.store.server.StoreServer` and against a server
started by torch (``torch.distributed.TCPStore(..., is_master=True)``), without importing torch.
It implements :class:`~launcher.store.api.KeyValueStore`. Opening (and reopening) the connection
is :mod:`launcher.store.connection`; this module is the requests and their replies.

Keys get the same ``"/"`` prefix torch's client adds, so a value set here under ``"k"`` is what a
worker's ``TCPStore.get("k")`` returns.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Final

from launcher.store.api import StoreConnectionError, StoreError, StoreTimeoutError
from launcher.store.connection import Deadline, open_connection, recv_exact
from launcher.store.protocol import (
    I64,
    KEY_PREFIX,
    U8,
    U32,
    U64,
    CheckResponse,
    QueryType,
    WaitResponse,
    as_bytes,
    encode_key,
    format_address,
    pack_blob,
)

__all__ = ["QueueEmptyError", "TCPStoreClient"]

# After a wait times out we send CANCEL_WAIT; the server answers at once, but give it this long
# before declaring the connection dead.
_CANCEL_GRACE_S: Final = 30.0


class QueueEmptyError(StoreError):
    """:meth:`TCPStoreClient.queue_pop` found the queue empty."""


class TCPStoreClient:
    """A connection to a TCPStore-protocol server at ``host:port``.

    ``timeout`` (seconds, ``None`` = forever) bounds every call, and is the default for calls
    that take their own ``timeout`` (:meth:`get`, :meth:`wait`, :meth:`multi_get`). The
    constructor connects, retrying with backoff until ``connect_timeout`` (default: ``timeout``)
    passes, then raises :class:`~launcher.store.api.StoreError` naming the address. A call that
    times out raises :class:`~launcher.store.api.StoreTimeoutError`; a timed-out wait leaves the
    connection usable, while any other failure drops it and the next call reconnects.

    ``secret``: prove this shared secret to the server before anything else (see
    ``docs/store-security.md``); the server must prove it too, or the connection fails. The
    secret itself never crosses the wire. ``refused_timeout`` (seconds, default: as
    ``connect_timeout``) is how long a (re)connection keeps trying while the server accepts and
    at once closes it, i.e. does not admit this host now (a store restricted to the members of a
    running round). ``reader``: this client only reads (``launcher status``), and says so on
    connecting, so a store that refuses it does not count it as an agent waiting to join.
    ``spare`` (a rendezvous client without a secret): a store that refuses it because the job's
    round is full or closed is asked, with a narrow request that touches no key, whether the job
    still runs; the client then waits as a spare, and raises
    :class:`~launcher.store.connection.JobEnded` once told the job ended, or
    :class:`~launcher.store.connection.SpareStoreGone` when the store went away without saying so
    (for ``gone_timeout`` seconds, ``None``: ``connect_timeout``).

    One call runs at a time (calls from several threads are serialized); use a client per thread
    for parallelism.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float | None = 300.0,
        connect_timeout: float | None = None,
        secret: bytes | None = None,
        refused_timeout: float | None = None,
        reader: bool = False,
        spare: bool = False,
        gone_timeout: float | None = None,
    ) -> None:
        if not 0 < port < 1 << 16:
            raise ValueError(f"port must be in [1, 65535], got {port}")
        self._host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        self._port = port
        self.timeout = timeout
        self._connect_timeout = timeout if connect_timeout is None else connect_timeout
        if secret is not None and not secret:
            raise ValueError("the store secret is empty")
        self._secret = secret
        #: How long a (re)connection keeps trying while the server does not admit this host
        #: (``None``: as :attr:`connect_timeout`).
        self.refused_timeout = refused_timeout
        self._reader = reader
        #: Once refused by a store restricted to a running job's nodes, wait as a spare (see
        #: :func:`~launcher.store.connection.open_connection`); ``gone_timeout`` bounds how long
        #: that store may then stop answering (``None``: as :attr:`connect_timeout`).
        self.spare = spare
        self.gone_timeout = gone_timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._closed = False
        self._connect()

    # ------------------------------------------------------------------ connection

    @property
    def host(self) -> str:
        """The server's host as given."""
        return self._host

    @property
    def port(self) -> int:
        """The server's port."""
        return self._port

    @property
    def address(self) -> str:
        """``host:port``, IPv6 hosts in brackets."""
        return format_address(self._host, self._port)

    @property
    def connect_timeout(self) -> float | None:
        """How long a (re)connection keeps retrying before the call fails (seconds)."""
        return self._connect_timeout

    @connect_timeout.setter
    def connect_timeout(self, seconds: float | None) -> None:
        # A long first connect (waiting for a node to come up) need not mean long reconnects
        # later, when a refused connection means the server is gone.
        self._connect_timeout = seconds

    @property
    def local_address(self) -> str | None:
        """This end's IP address on the current connection: the address the server sees this
        client as (``None`` while not connected)."""
        sock = self._sock
        if sock is None:
            return None
        try:
            name = sock.getsockname()
        except OSError:
            return None
        return str(name[0]) if isinstance(name, tuple) and name else None

    def _connect(self) -> None:
        self._sock = open_connection(
            self._host,
            self._port,
            connect_timeout=self._connect_timeout,
            secret=self._secret,
            refused_timeout=self.refused_timeout,
            reader=self._reader,
            spare=self.spare,
            gone_timeout=self.gone_timeout,
        )

    def close(self) -> None:
        """Close the connection; later calls raise :class:`StoreError`. Idempotent, and safe to
        call from another thread to interrupt a blocked call."""
        self._closed = True
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> TCPStoreClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TCPStoreClient({self.address}{', closed' if self._closed else ''})"

    # ------------------------------------------------------------------ plumbing

    @contextlib.contextmanager
    def _call(self) -> Iterator[socket.socket]:
        """Serialize a call, (re)connect if needed, and turn socket failures into store errors."""
        with self._lock:
            if self._closed:
                raise StoreError(f"store client for {self.address} is closed")
            if self._sock is None:
                self._connect()
            sock = self._sock
            assert sock is not None
            try:
                yield sock
            except StoreError:
                raise
            except TimeoutError as exc:
                # The reply may still arrive later and would be read as the answer to the next
                # call: the connection cannot be trusted any more.
                self._drop()
                raise StoreTimeoutError(f"store call to {self.address} timed out after {self.timeout} s") from exc
            except OSError as exc:
                self._drop()
                if self._closed:
                    raise StoreError(f"store client for {self.address} was closed") from exc
                raise StoreConnectionError(f"connection to the store at {self.address} failed: {exc}") from exc
            except BaseException:
                # Anything else mid-call (a signal handler's exception ending a rendezvous, say)
                # leaves the reply unread: the next call would read it as its own, or wait for one
                # that never comes. Reconnect instead.
                self._drop()
                raise

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _send(self, sock: socket.socket, data: bytes, deadline: Deadline) -> None:
        sock.settimeout(deadline.remaining())
        sock.sendall(data)

    def _recv_u8(self, sock: socket.socket, deadline: Deadline) -> int:
        return recv_exact(sock, 1, deadline)[0]

    def _recv_i64(self, sock: socket.socket, deadline: Deadline) -> int:
        return int(I64.unpack(recv_exact(sock, 8, deadline))[0])

    def _recv_blob(self, sock: socket.socket, deadline: Deadline) -> bytes:
        (n,) = U64.unpack(recv_exact(sock, 8, deadline))
        return recv_exact(sock, n, deadline) if n else b""

    def _deadline(self) -> Deadline:
        return Deadline(self.timeout)

    @staticmethod
    def _keys(keys: Sequence[str]) -> bytes:
        return U64.pack(len(keys)) + b"".join(pack_blob(encode_key(k)) for k in keys)

    def _wait_reply(self, sock: socket.socket, timeout: float | None, what: str) -> None:
        """After WAIT or BARRIER: block for STOP_WAITING, or cancel once ``timeout`` passes."""
        try:
            reply = self._recv_u8(sock, Deadline(timeout))
        except TimeoutError:
            pass  # nothing was read, so the stream is still in step: cancel below
        else:
            if reply != WaitResponse.STOP_WAITING:
                raise StoreError(f"store at {self.address} sent {reply} while we were waiting")
            return
        grace = Deadline(_CANCEL_GRACE_S)
        self._send(sock, U8.pack(QueryType.CANCEL_WAIT), grace)
        reply = self._recv_u8(sock, grace)
        if reply == WaitResponse.STOP_WAITING:
            # The wait finished just before the cancel arrived; the cancel is acknowledged next.
            reply = self._recv_u8(sock, grace)
        if reply != WaitResponse.WAIT_CANCELED:
            raise StoreError(f"store at {self.address} sent {reply} instead of acknowledging a cancel")
        raise StoreTimeoutError(f"timed out after {timeout} s waiting for {what} on the store at {self.address}")

    def _do_wait(self, sock: socket.socket, keys: Sequence[str], timeout: float | None) -> None:
        self._send(sock, U8.pack(QueryType.WAIT) + self._keys(keys), self._deadline())
        self._wait_reply(sock, timeout, f"keys {list(keys)[:5]}")

    def _resolve(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    # ------------------------------------------------------------------ KeyValueStore

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value`` (``str`` values are UTF-8 encoded)."""
        msg = U8.pack(QueryType.SET) + pack_blob(encode_key(key)) + pack_blob(as_bytes(value))
        with self._call() as sock:
            self._send(sock, msg, self._deadline())

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds for it to exist."""
        with self._call() as sock:
            self._do_wait(sock, [key], self._resolve(timeout))
            deadline = self._deadline()
            self._send(sock, U8.pack(QueryType.GET) + pack_blob(encode_key(key)), deadline)
            return self._recv_blob(sock, deadline)

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (missing counts as 0); the new value."""
        msg = U8.pack(QueryType.ADD) + pack_blob(encode_key(key)) + I64.pack(amount)
        with self._call() as sock:
            deadline = self._deadline()
            self._send(sock, msg, deadline)
            return self._recv_i64(sock, deadline)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and ``expected`` is
        empty); return the value now stored. Quirk kept from torch's server: for a missing key
        and a non-empty ``expected`` the answer is ``expected`` although nothing is stored, so
        test success with ``result == desired``."""
        msg = (
            U8.pack(QueryType.COMPARE_SET)
            + pack_blob(encode_key(key))
            + pack_blob(as_bytes(expected))
            + pack_blob(as_bytes(desired))
        )
        with self._call() as sock:
            deadline = self._deadline()
            self._send(sock, msg, deadline)
            return self._recv_blob(sock, deadline)

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Values of several keys, waiting up to ``timeout`` seconds until all exist."""
        keys = list(keys)
        with self._call() as sock:
            self._do_wait(sock, keys, self._resolve(timeout))
            deadline = self._deadline()
            self._send(sock, U8.pack(QueryType.MULTI_GET) + self._keys(keys), deadline)
            return [self._recv_blob(sock, deadline) for _ in keys]

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set several keys in one request."""
        if len(keys) != len(values):
            raise ValueError("multi_set needs as many values as keys")
        body = b"".join(pack_blob(encode_key(k)) + pack_blob(as_bytes(v)) for k, v in zip(keys, values, strict=True))
        msg = U8.pack(QueryType.MULTI_SET) + I64.pack(len(keys)) + body
        with self._call() as sock:
            self._send(sock, msg, self._deadline())

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, without waiting."""
        with self._call() as sock:
            deadline = self._deadline()
            self._send(sock, U8.pack(QueryType.CHECK) + self._keys(keys), deadline)
            reply = self._recv_u8(sock, deadline)
        if reply not in (CheckResponse.READY, CheckResponse.NOT_READY):
            raise StoreError(f"store at {self.address} answered CHECK with {reply}")
        return reply == CheckResponse.READY

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key exists; :class:`StoreTimeoutError` after ``timeout`` seconds."""
        with self._call() as sock:
            self._do_wait(sock, list(keys), self._resolve(timeout))

    def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        with self._call() as sock:
            deadline = self._deadline()
            self._send(sock, U8.pack(QueryType.DELETE_KEY) + pack_blob(encode_key(key)), deadline)
            return self._recv_i64(sock, deadline) == 1

    # ------------------------------------------------------------------ extras

    def num_keys(self) -> int:
        """How many keys the server holds (every namespace, as torch's ``num_keys`` counts)."""
        with self._call() as sock:
            deadline = self._deadline()
            self._send(sock, U8.pack(QueryType.GETNUMKEYS), deadline)
            return self._recv_i64(sock, deadline)

    def append(self, key: str, value: bytes) -> None:
        """Append ``value`` to the bytes at ``key``, creating it if missing."""
        msg = U8.pack(QueryType.APPEND) + pack_blob(encode_key(key)) + pack_blob(as_bytes(value))
        with self._call() as sock:
            self._send(sock, msg, self._deadline())

    def ping(self) -> None:
        """Round-trip a nonce; raises :class:`StoreError` when the server is gone."""
        nonce = random.getrandbits(32)
        with self._call() as sock:
            deadline = self._deadline()
            self._send(sock, U8.pack(QueryType.PING) + U32.pack(nonce), deadline)
            (echo,) = U32.unpack(recv_exact(sock, 4, deadline))
        if echo != nonce:
            raise StoreError(f"store at {self.address} answered a ping with {echo}, expected {nonce}")

    def list_keys(self) -> list[str]:
        """The keys in this client's namespace (those torch's and our clients set)."""
        with self._call() as sock:
            deadline = self._deadline()
            self._send(sock, U8.pack(QueryType.LIST_KEYS), deadline)
            count = self._recv_i64(sock, deadline)
            raw = [self._recv_blob(sock, deadline) for _ in range(count)]
        prefix = KEY_PREFIX.encode()
        return [k[len(prefix) :].decode("utf-8", "replace") for k in raw if k.startswith(prefix)]

    def barrier(self, key: str, world_size: int, timeout: float | None = None) -> None:
        """Arrive at the barrier ``key`` and block until ``world_size`` participants have."""
        msg = U8.pack(QueryType.BARRIER) + pack_blob(encode_key(key)) + I64.pack(world_size)
        with self._call() as sock:
            self._send(sock, msg, self._deadline())
            self._wait_reply(sock, self._resolve(timeout), f"barrier {key!r}")

    def queue_push(self, key: str, value: bytes) -> None:
        """Append ``value`` to the queue ``key`` (a namespace separate from plain keys)."""
        msg = U8.pack(QueryType.QUEUE_PUSH) + pack_blob(encode_key(key)) + pack_blob(as_bytes(value))
        with self._call() as sock:
            self._send(sock, msg, self._deadline())

    def queue_pop(self, key: str, block: bool = True, timeout: float | None = None) -> bytes:
        """Remove and return the oldest item of queue ``key``; with ``block``, wait up to
        ``timeout`` seconds for one, else raise :class:`QueueEmptyError` when empty."""
        with self._call() as sock:
            if block:
                self._do_wait(sock, [key], self._resolve(timeout))
            deadline = self._deadline()
            self._send(sock, U8.pack(QueryType.QUEUE_POP) + pack_blob(encode_key(key)), deadline)
            length = self._recv_i64(sock, deadline)
            if length <= 0:
                raise QueueEmptyError(f"queue {key!r} is empty")
            return self._recv_blob(sock, deadline)

    def queue_len(self, key: str) -> int:
        """Number of items in queue ``key``."""
        with self._call() as sock:
            deadline = self._deadline()
            self._send(sock, U8.pack(QueryType.QUEUE_LEN) + pack_blob(encode_key(key)), deadline)
            return self._recv_i64(sock, deadline)
