"""A key-value store server that speaks torch's TCPStore wire protocol, in pure Python.

The agent serves this store at ``MASTER_ADDR:MASTER_PORT``; workers started with
``TORCHELASTIC_USE_AGENT_STORE=True`` connect to it with torch's own ``TCPStore`` client
(``is_master=False``), so the agent itself never has to import torch.

Design:

* One daemon thread runs a :mod:`selectors` loop over non-blocking sockets: the listening
  socket, a wake-up socket pair, and every client connection. There is no thread per client, so
  thousands of idle or waiting clients cost only a file descriptor and a small buffer each.
* Requests are parsed incrementally from a per-connection input buffer; a request is executed
  only once all of its bytes have arrived, so a slow client never blocks the loop.
* A connection that fails validation or sends a malformed request is closed; the server and
  every other connection carry on.
* :attr:`StoreServer.store` is an in-process view of the same data (a
  :class:`~launcher.store.api.KeyValueStore`) for the agent, sharing the key namespace that
  torch's clients use.

Only the standard library is imported here: ``import torch`` costs more than a second.
See ``docs/store.md`` for the wire format.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import re
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Final, TypeVar

from launcher.store.api import StoreError, StoreTimeoutError

__all__ = [
    "KEY_PREFIX",
    "VALIDATION_MAGIC",
    "CheckResponse",
    "LocalStore",
    "QueryType",
    "StoreServer",
    "WaitResponse",
    "format_address",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: The number a client sends right after connecting to prove it speaks this protocol.
VALIDATION_MAGIC: Final = 0x3C85F7CE

#: torch's TCPStore client puts this in front of every user key (``set("a")`` stores ``"/a"``).
#: Our client and :class:`LocalStore` do the same so all three see one namespace.
KEY_PREFIX: Final = "/"


class QueryType(enum.IntEnum):
    """Request codes: the first byte of every client message (torch 2.13 numbering)."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


class CheckResponse(enum.IntEnum):
    """One-byte answer to CHECK."""

    READY = 0
    NOT_READY = 1


class WaitResponse(enum.IntEnum):
    """One-byte answers to WAIT, BARRIER and CANCEL_WAIT."""

    STOP_WAITING = 0
    WAIT_CANCELED = 1


# Upper bounds that tell a malformed message from a real one. They are well above torch's own
# libuv server limits (8 KiB keys, 8 MiB values, 128 Ki keys per request), so anything torch's
# server accepts, this one accepts too.
MAX_KEY_LEN: Final = 1 << 20
MAX_VALUE_LEN: Final = 1 << 30
MAX_KEY_COUNT: Final = 1 << 20

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1

_STOP_WAITING: Final = bytes([WaitResponse.STOP_WAITING])
_WAIT_CANCELED: Final = bytes([WaitResponse.WAIT_CANCELED])

_RECV_SIZE: Final = 256 * 1024
# Accept at most this many connections per loop turn so a connection storm cannot starve
# requests from clients that are already connected.
_ACCEPT_BATCH: Final = 512
# The kernel clamps this to net.core.somaxconn; a large value lets a burst of thousands of
# simultaneous connects queue up instead of being refused.
_BACKLOG: Final = 65535
_ACCEPT_PAUSE_S: Final = 0.1

# Like C's strtoll as torch's server uses it: optional leading whitespace, an optional sign and
# digits; anything after the digits is ignored.
_LEADING_INT = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def format_address(host: str, port: int) -> str:
    """``host:port``, with IPv6 literals in brackets (``[::1]:29500``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_int(value: bytes) -> int:
    match = _LEADING_INT.match(value)
    if match is None:
        raise ValueError(f"value {value[:40]!r} is not an integer")
    number = int(match.group(1))
    if not _I64_MIN <= number <= _I64_MAX:
        raise ValueError(f"value {value[:40]!r} does not fit in a signed 64-bit integer")
    return number


def _encode_key(key: str) -> bytes:
    return (KEY_PREFIX + key).encode("utf-8")


def _as_bytes(value: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


class _NeedMore(Exception):
    """The input buffer ends inside a message; wait for more bytes."""


class _ProtocolError(Exception):
    """The peer sent something this protocol does not allow; its connection is closed."""


class _Reader:
    """Reads protocol fields from a connection's input buffer without consuming it."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytearray, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def _unpack(self, fmt: struct.Struct) -> int:
        end = self.pos + fmt.size
        if end > len(self.buf):
            raise _NeedMore
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos = end
        return int(value)

    def u8(self) -> int:
        return self._unpack(_U8)

    def u32(self) -> int:
        return self._unpack(_U32)

    def i64(self) -> int:
        return self._unpack(_I64)

    def count(self) -> int:
        # Counts are size_t on the wire (int64 for MULTI_SET; same bytes for sane values).
        n = self._unpack(_U64)
        if n > MAX_KEY_COUNT:
            raise _ProtocolError(f"too many keys in one request ({n})")
        return n

    def _blob(self, limit: int, what: str) -> bytes:
        n = self._unpack(_U64)
        if n > limit:
            raise _ProtocolError(f"{what} of {n} bytes exceeds the limit of {limit}")
        end = self.pos + n
        if end > len(self.buf):
            raise _NeedMore
        data = bytes(self.buf[self.pos : end])
        self.pos = end
        return data

    def key(self) -> bytes:
        return self._blob(MAX_KEY_LEN, "key")

    def value(self) -> bytes:
        return self._blob(MAX_VALUE_LEN, "value")

    def keys(self) -> list[bytes]:
        return [self.key() for _ in range(self.count())]


def _pack_blob(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


class _Conn:
    """One client connection's state (touched only with the server lock held)."""

    __slots__ = ("sock", "peer", "inbuf", "outbuf", "validated", "waiter", "closed", "want_write")

    def __init__(self, sock: socket.socket, peer: object) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.validated = False
        self.waiter: _Waiter | None = None
        self.closed = False
        self.want_write = False


class _Waiter:
    """A connection blocked in WAIT or BARRIER, and the keys it still needs."""

    __slots__ = ("conn", "missing")

    def __init__(self, conn: _Conn, missing: set[bytes]) -> None:
        self.conn = conn
        self.missing = missing


_LISTENER: Final = object()
_WAKEUP: Final = object()


def _raise_nofile_limit() -> None:
    """Lift the soft open-files limit towards the hard one: every client costs a descriptor, and
    a default soft limit of 1024 would cap a rendezvous far below 2,000 nodes."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):  # pragma: no cover - best effort
        pass


class StoreServer:
    """A TCPStore-compatible server running on one background thread.

    ``host``/``port`` say where to listen (``port=0``: the kernel picks a free port, read it back
    from :attr:`port` after :meth:`start`). ``host`` may be a name, an IPv4 or IPv6 literal
    (``"::1"``, ``"[::1]"``), or ``""``/``"::"`` for every interface (dual-stack where the
    system allows). Alternatively pass an already bound ``sock``; the server takes ownership and
    closes it in :meth:`close`.

    :meth:`start` also lifts this process's soft open-files limit towards the hard limit, since
    every connected client holds a descriptor.

    Use as a context manager, or call :meth:`start` and :meth:`close`::

        with StoreServer() as server:
            env["MASTER_ADDR"], env["MASTER_PORT"] = server.host, str(server.port)
            ...
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, sock: socket.socket | None = None) -> None:
        if not 0 <= port < 1 << 16:
            raise ValueError(f"port must be in [0, 65535], got {port}")
        self._requested_host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        self._requested_port = port
        self._listener: socket.socket | None = sock
        self._bound: tuple[str, int] | None = None

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._stopping = False
        self._closed = False  # no more requests (set by close(), or when the loop dies)
        self._close_called = False
        self._sockets_closed = False
        self._accept_paused_until: float | None = None

        self._conns: set[_Conn] = set()
        self._dirty: set[_Conn] = set()  # connections with output queued outside their own turn

        # The data. Keys are raw bytes exactly as clients send them (torch's prefix included).
        self._kv: dict[bytes, bytes] = {}
        self._queues: dict[bytes, deque[bytes]] = {}
        # key -> waiters blocked on it, in arrival order (dict: O(1) removal on cancel).
        self._waiting: dict[bytes, dict[int, _Waiter]] = {}
        self._local_waiters = 0

        self._handlers: dict[int, Callable[[_Conn, _Reader], None]] = {
            QueryType.VALIDATE: self._q_validate,
            QueryType.SET: self._q_set,
            QueryType.COMPARE_SET: self._q_compare_set,
            QueryType.GET: self._q_get,
            QueryType.ADD: self._q_add,
            QueryType.CHECK: self._q_check,
            QueryType.WAIT: self._q_wait,
            QueryType.GETNUMKEYS: self._q_num_keys,
            QueryType.DELETE_KEY: self._q_delete,
            QueryType.APPEND: self._q_append,
            QueryType.MULTI_GET: self._q_multi_get,
            QueryType.MULTI_SET: self._q_multi_set,
            QueryType.CANCEL_WAIT: self._q_cancel_wait,
            QueryType.PING: self._q_ping,
            QueryType.QUEUE_PUSH: self._q_queue_push,
            QueryType.QUEUE_POP: self._q_queue_pop,
            QueryType.QUEUE_LEN: self._q_queue_len,
            QueryType.LIST_KEYS: self._q_list_keys,
            QueryType.BARRIER: self._q_barrier,
        }
        self._store = LocalStore(self)

    # ------------------------------------------------------------------ public API

    @property
    def host(self) -> str:
        """The numeric address listened on once started (e.g. ``"127.0.0.1"``, ``"::1"``);
        before that, the host asked for."""
        return self._bound[0] if self._bound else self._requested_host

    @property
    def port(self) -> int:
        """The port listened on once started (the kernel's choice when asked for 0)."""
        return self._bound[1] if self._bound else self._requested_port

    @property
    def address(self) -> str:
        """``host:port``, IPv6 hosts in brackets."""
        return format_address(self.host, self.port)

    @property
    def store(self) -> LocalStore:
        """In-process access to this server's data, without a socket (for the agent)."""
        return self._store

    @property
    def running(self) -> bool:
        """Whether the serving thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> StoreServer:
        """Bind (unless given a socket), listen and start serving; returns ``self``.

        Raises :class:`~launcher.store.api.StoreError` when the address cannot be bound.
        """
        if self._closed:
            raise StoreError("store server is closed")
        if self._thread is not None:
            raise StoreError("store server already started")
        listener = self._listener if self._listener is not None else self._bind()
        self._listener = listener
        try:
            listener.listen(_BACKLOG)
            listener.setblocking(False)
            name = listener.getsockname()
        except OSError as exc:
            self._close_listener()
            raise StoreError(f"cannot listen on {self._requested_address()}: {exc}") from exc
        self._bound = (str(name[0]), int(name[1]))

        _raise_nofile_limit()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKEUP)

        self._thread = threading.Thread(target=self._serve, name=f"launcher-store-{self.port}", daemon=True)
        self._thread.start()
        log.debug("store server listening on %s", self.address)
        return self

    def discard_keys(self, keep_prefixes: tuple[str, ...] = ()) -> int:
        """Delete every key except those under ``keep_prefixes`` (keys as clients name them).

        A restarted worker group must not read what the previous attempt's workers wrote (a
        dead rank's address, say); torch avoids that by serving a new store per attempt, and a
        store that outlives attempts (the static backend's, on a fixed port) clears instead.
        Returns how many keys were deleted.
        """
        keep = tuple((KEY_PREFIX + prefix).encode() for prefix in keep_prefixes)

        def _discard() -> int:
            doomed = [key for key in self._kv if not key.startswith(keep)] if keep else list(self._kv)
            for key in doomed:
                del self._kv[key]
            return len(doomed)

        return self._local(_discard)

    def close(self) -> None:
        """Stop serving and close the listener and every client connection.

        Clients blocked in a wait see their connection drop; threads blocked in
        :class:`LocalStore` calls get a :class:`~launcher.store.api.StoreError`. Idempotent.
        """
        with self._lock:
            if self._close_called:
                return
            self._close_called = True
            self._closed = True
            self._stopping = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self._poke()
            thread.join(timeout=10.0)
            if thread.is_alive():  # pragma: no cover - the loop wakes within one select call
                log.warning("store server thread did not stop within 10 s")
        with self._lock:
            self._close_sockets()
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()

    def __enter__(self) -> StoreServer:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._thread else "new"
        return f"StoreServer({self.address}, {state}, clients={len(self._conns)})"

    # ------------------------------------------------------------------ socket setup

    def _requested_address(self) -> str:
        return format_address(self._requested_host or "*", self._requested_port)

    def _bind(self) -> socket.socket:
        host, port = self._requested_host, self._requested_port
        candidates: list[tuple[socket.AddressFamily, tuple[object, ...]]] = []
        if host in ("", "*"):
            # Every interface: dual-stack IPv6 when available, else IPv4.
            if socket.has_ipv6:
                candidates.append((socket.AF_INET6, ("::", port, 0, 0)))
            candidates.append((socket.AF_INET, ("0.0.0.0", port)))
        else:
            try:
                infos = socket.getaddrinfo(
                    host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
                )
            except socket.gaierror as exc:
                raise StoreError(f"cannot listen on {self._requested_address()}: {exc}") from exc
            candidates = [(family, tuple(addr)) for family, _, _, _, addr in infos]
        last: OSError | None = None
        for family, addr in candidates:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                # Lets a restarted agent rebind a port whose old connections sit in TIME_WAIT.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and addr[0] == "::":
                    with contextlib.suppress(OSError):  # IPv6-only systems refuse; fine
                        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind(addr)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise StoreError(f"cannot listen on {self._requested_address()}: {last}") from last

    def _close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            finally:
                self._listener = None

    def _close_sockets(self) -> None:
        # Lock held. Called from the serving thread on exit and again from close(): idempotent.
        if self._sockets_closed:
            return
        self._sockets_closed = True
        for conn in list(self._conns):
            self._drop(conn)
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        self._close_listener()

    def _poke(self) -> None:
        """Wake the serving thread (to stop, or to flush output queued from another thread)."""
        if self._wake_w is None:
            return
        # A full buffer means a wake-up is already pending; a closed one that we are done.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # ------------------------------------------------------------------ event loop

    def _serve(self) -> None:
        sel = self._selector
        assert sel is not None
        try:
            while not self._stopping:
                timeout: float | None = None
                if self._accept_paused_until is not None:
                    timeout = max(0.0, self._accept_paused_until - time.monotonic())
                events = sel.select(timeout)
                with self._lock:
                    if self._stopping:
                        break
                    paused_until = self._accept_paused_until
                    if paused_until is not None and time.monotonic() >= paused_until:
                        self._accept_paused_until = None
                        assert self._listener is not None
                        sel.register(self._listener, selectors.EVENT_READ, _LISTENER)
                    for key, mask in events:
                        try:
                            self._dispatch(key.data, mask)
                        except Exception:  # a bug here must not take the whole store down
                            log.exception("store server: unexpected error; dropping that connection")
                            if isinstance(key.data, _Conn):
                                self._drop(key.data)
                    self._flush_dirty()
        except Exception:  # pragma: no cover - selector failure
            log.exception("store server loop failed")
        finally:
            with self._lock:
                # However the loop ended, the store is unusable now: say so to local callers.
                self._closed = True
                self._close_sockets()
                self._cond.notify_all()

    def _dispatch(self, data: object, mask: int) -> None:
        if data is _LISTENER:
            self._accept()
        elif data is _WAKEUP:
            assert self._wake_r is not None
            try:
                while self._wake_r.recv(4096):
                    pass
            except OSError:
                pass
        elif isinstance(data, _Conn) and not data.closed:
            if mask & selectors.EVENT_READ:
                self._on_readable(data)
            if not data.closed and mask & selectors.EVENT_WRITE:
                self._flush(data)

    def _accept(self) -> None:
        assert self._listener is not None and self._selector is not None
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: the pending connection keeps the listener readable, so
                    # stop watching it briefly instead of spinning.
                    log.warning("store server cannot accept connections: %s; pausing", exc)
                    self._selector.unregister(self._listener)
                    self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE_S
                    return
                if exc.errno == errno.ECONNABORTED:
                    continue
                log.warning("store server accept failed: %s", exc)
                return
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                # Replies are tiny and latency-bound; do not let Nagle hold them back.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, peer)
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._conns.add(conn)

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.debug("store client %s: %s", conn.peer, exc)
            self._drop(conn)
            return
        if not data:
            self._drop(conn)
            return
        conn.inbuf += data
        try:
            self._process(conn)
        except _ProtocolError as exc:
            if conn.validated:
                log.warning("store client %s sent a malformed request (%s); closing it", conn.peer, exc)
            else:
                log.debug("store connection from %s is not a TCPStore client (%s); closing", conn.peer, exc)
            self._drop(conn)
            return
        if conn.outbuf and not conn.closed:
            self._flush(conn)

    def _process(self, conn: _Conn) -> None:
        buf = conn.inbuf
        pos = 0
        try:
            while pos < len(buf) and not conn.closed:
                reader = _Reader(buf, pos)
                try:
                    query = reader.u8()
                    if not conn.validated and query != QueryType.VALIDATE:
                        raise _ProtocolError(f"expected a validation message first, got query {query}")
                    handler = self._handlers.get(query)
                    if handler is None:
                        raise _ProtocolError(f"unknown query type {query}")
                    # Handlers read all their fields before changing anything, so running out of
                    # bytes (_NeedMore) never leaves a half-executed request.
                    handler(conn, reader)
                except _NeedMore:
                    break
                except ValueError as exc:  # e.g. ADD on a value that is not an integer
                    raise _ProtocolError(str(exc)) from exc
                pos = reader.pos
        finally:
            if pos:
                del buf[:pos]

    def _flush(self, conn: _Conn) -> None:
        if conn.closed:
            return
        sent = 0
        if conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                log.debug("store client %s: %s", conn.peer, exc)
                self._drop(conn)
                return
            del conn.outbuf[:sent]
        want_write = bool(conn.outbuf)
        if want_write != conn.want_write and self._selector is not None:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
            self._selector.modify(conn.sock, events, conn)
            conn.want_write = want_write

    def _flush_dirty(self) -> None:
        while self._dirty:
            self._flush(self._dirty.pop())

    def _drop(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._clear_wait(conn)
        self._conns.discard(conn)
        self._dirty.discard(conn)
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _send(self, conn: _Conn, data: bytes) -> None:
        conn.outbuf += data
        self._dirty.add(conn)

    # ------------------------------------------------------------------ waiting

    def _present(self, key: bytes) -> bool:
        return key in self._kv or bool(self._queues.get(key))

    def _register_wait(self, conn: _Conn, missing: set[bytes]) -> None:
        # torch's client never has two waits in flight on one connection; if a peer does, the
        # newer one replaces the older.
        self._clear_wait(conn)
        waiter = _Waiter(conn, missing)
        conn.waiter = waiter
        for key in missing:
            self._waiting.setdefault(key, {})[id(waiter)] = waiter

    def _clear_wait(self, conn: _Conn) -> None:
        waiter = conn.waiter
        if waiter is None:
            return
        conn.waiter = None
        for key in waiter.missing:
            waiters = self._waiting.get(key)
            if waiters is not None:
                waiters.pop(id(waiter), None)
                if not waiters:
                    del self._waiting[key]

    def _release(self, waiter: _Waiter) -> None:
        waiter.conn.waiter = None
        self._send(waiter.conn, _STOP_WAITING)

    def _key_ready(self, key: bytes) -> None:
        """``key`` was written: release every waiter that needed only it."""
        waiters = self._waiting.pop(key, None)
        if waiters:
            for waiter in waiters.values():
                waiter.missing.discard(key)
                if not waiter.missing:
                    self._release(waiter)
        if self._local_waiters:
            self._cond.notify_all()

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
        if self._local_waiters:
            self._cond.notify_all()

    # ------------------------------------------------------------------ data operations
    # All run with the lock held, from the serving thread or from LocalStore.

    def _op_set(self, key: bytes, value: bytes) -> None:
        self._kv[key] = value
        self._key_ready(key)

    def _op_compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        current = self._kv.get(key)
        if current is None:
            if expected:
                # torch's server answers with `expected` here although nothing is stored;
                # clients compare the answer with `desired`, so the swap reads as failed.
                return expected
            self._kv[key] = desired
            self._key_ready(key)
            return desired
        if current == expected:
            self._kv[key] = desired
            self._key_ready(key)
            return desired
        return current

    def _op_add(self, key: bytes, amount: int) -> int:
        current = self._kv.get(key)
        total = amount + (_parse_int(current) if current is not None else 0)
        if not _I64_MIN <= total <= _I64_MAX:
            raise ValueError(f"adding {amount} overflows a signed 64-bit integer")
        self._kv[key] = str(total).encode()
        self._key_ready(key)
        return total

    def _op_append(self, key: bytes, value: bytes) -> None:
        self._kv[key] = self._kv.get(key, b"") + value
        self._key_ready(key)

    def _op_delete(self, key: bytes) -> bool:
        return self._kv.pop(key, None) is not None

    # ------------------------------------------------------------------ request handlers

    def _q_validate(self, conn: _Conn, r: _Reader) -> None:
        magic = r.u32()
        if magic != VALIDATION_MAGIC:
            raise _ProtocolError(f"bad validation number {magic:#x}")
        conn.validated = True

    def _q_ping(self, conn: _Conn, r: _Reader) -> None:
        nonce = r.u32()
        self._send(conn, _U32.pack(nonce))

    def _q_set(self, conn: _Conn, r: _Reader) -> None:
        key, value = r.key(), r.value()
        self._op_set(key, value)

    def _q_compare_set(self, conn: _Conn, r: _Reader) -> None:
        key, expected, desired = r.key(), r.value(), r.value()
        self._send(conn, _pack_blob(self._op_compare_set(key, expected, desired)))

    def _q_get(self, conn: _Conn, r: _Reader) -> None:
        # The client waits for the key first; a missing key reads as empty, like torch's server.
        key = r.key()
        self._send(conn, _pack_blob(self._kv.get(key, b"")))

    def _q_add(self, conn: _Conn, r: _Reader) -> None:
        key, amount = r.key(), r.i64()
        self._send(conn, _I64.pack(self._op_add(key, amount)))

    def _q_check(self, conn: _Conn, r: _Reader) -> None:
        keys = r.keys()
        ready = all(self._present(k) for k in keys)
        self._send(conn, bytes([CheckResponse.READY if ready else CheckResponse.NOT_READY]))

    def _q_wait(self, conn: _Conn, r: _Reader) -> None:
        keys = r.keys()
        missing = {k for k in keys if not self._present(k)}
        if missing:
            self._register_wait(conn, missing)
        else:
            self._send(conn, _STOP_WAITING)

    def _q_cancel_wait(self, conn: _Conn, r: _Reader) -> None:
        # If the wait already completed, STOP_WAITING went out first; the client expects both.
        self._clear_wait(conn)
        self._send(conn, _WAIT_CANCELED)

    def _q_num_keys(self, conn: _Conn, r: _Reader) -> None:
        self._send(conn, _I64.pack(len(self._kv)))

    def _q_delete(self, conn: _Conn, r: _Reader) -> None:
        key = r.key()
        self._send(conn, _I64.pack(1 if self._op_delete(key) else 0))

    def _q_append(self, conn: _Conn, r: _Reader) -> None:
        key, value = r.key(), r.value()
        self._op_append(key, value)

    def _q_multi_get(self, conn: _Conn, r: _Reader) -> None:
        keys = r.keys()
        self._send(conn, b"".join(_pack_blob(self._kv.get(k, b"")) for k in keys))

    def _q_multi_set(self, conn: _Conn, r: _Reader) -> None:
        pairs = [(r.key(), r.value()) for _ in range(r.count())]
        for key, value in pairs:
            self._op_set(key, value)

    def _q_queue_push(self, conn: _Conn, r: _Reader) -> None:
        key, value = r.key(), r.value()
        self._queues.setdefault(key, deque()).append(value)
        self._queue_ready(key)

    def _q_queue_pop(self, conn: _Conn, r: _Reader) -> None:
        # Reply: the queue's length before the pop, then the item when there was one.
        key = r.key()
        queue = self._queues.get(key)
        if not queue:
            self._send(conn, _I64.pack(0))
            return
        length = len(queue)
        item = queue.popleft()
        if not queue:
            del self._queues[key]
        self._send(conn, _I64.pack(length) + _pack_blob(item))

    def _q_queue_len(self, conn: _Conn, r: _Reader) -> None:
        key = r.key()
        self._send(conn, _I64.pack(len(self._queues.get(key, ()))))

    def _q_list_keys(self, conn: _Conn, r: _Reader) -> None:
        keys = list(self._kv)
        self._send(conn, _I64.pack(len(keys)) + b"".join(_pack_blob(k) for k in keys))

    def _q_barrier(self, conn: _Conn, r: _Reader) -> None:
        # The key holds the arrival count as a decimal string. Arrivals before the last one
        # block; the last one releases everybody (and anyone in WAIT on the key).
        key, world_size = r.key(), r.i64()
        current = self._kv.get(key)
        count = (_parse_int(current) if current is not None else 0) + 1
        self._kv[key] = str(count).encode()
        if count >= world_size:
            self._key_ready(key)
            self._send(conn, _STOP_WAITING)
        else:
            self._register_wait(conn, {key})

    # ------------------------------------------------------------------ local access

    def _local(self, fn: Callable[[], _T]) -> _T:
        with self._lock:
            if self._closed:
                raise StoreError("store server is closed")
            try:
                result = fn()
            except ValueError as exc:
                raise StoreError(str(exc)) from exc
            queued = bool(self._dirty)
        if queued:
            self._poke()  # released waiters' replies go out from the serving thread
        return result

    def _local_wait(self, keys: Iterable[bytes], timeout: float | None) -> None:
        keys = list(keys)
        with self._lock:
            if self._closed:
                raise StoreError("store server is closed")
            self._local_waiters += 1
            try:
                ok = self._cond.wait_for(lambda: self._closed or all(self._present(k) for k in keys), timeout)
            finally:
                self._local_waiters -= 1
            if self._closed:
                raise StoreError("store server closed while waiting")
        if not ok:
            raise StoreTimeoutError(f"timed out after {timeout} s waiting for keys {_describe(keys)}")


def _describe(keys: Sequence[bytes]) -> str:
    shown = ", ".join(repr(k.decode("utf-8", "replace").removeprefix(KEY_PREFIX)) for k in keys[:5])
    return f"[{shown}{', ...' if len(keys) > 5 else ''}]"


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
        k, v = _encode_key(key), _as_bytes(value)
        self._server._local(lambda: self._server._op_set(k, v))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists."""
        k = _encode_key(key)
        self._server._local_wait([k], self._timeout(timeout))
        return self._server._local(lambda: self._server._kv.get(k, b""))

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (missing counts as 0); the new value."""
        k = _encode_key(key)
        return self._server._local(lambda: self._server._op_add(k, int(amount)))

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and ``expected`` is
        empty). Returns the value now stored, except that for a missing key with a non-empty
        ``expected`` it returns ``expected`` (torch's server does the same)."""
        k, e, d = _encode_key(key), _as_bytes(expected), _as_bytes(desired)
        return self._server._local(lambda: self._server._op_compare_set(k, e, d))

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Values of several keys, waiting until all exist."""
        ks = [_encode_key(k) for k in keys]
        self._server._local_wait(ks, self._timeout(timeout))
        return self._server._local(lambda: [self._server._kv.get(k, b"") for k in ks])

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set several keys at once."""
        if len(keys) != len(values):
            raise ValueError("multi_set needs as many values as keys")
        pairs = [(_encode_key(k), _as_bytes(v)) for k, v in zip(keys, values, strict=True)]

        def run() -> None:
            for k, v in pairs:
                self._server._op_set(k, v)

        self._server._local(run)

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, without waiting."""
        ks = [_encode_key(k) for k in keys]
        return self._server._local(lambda: all(self._server._present(k) for k in ks))

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key exists; :class:`StoreTimeoutError` after ``timeout`` seconds."""
        self._server._local_wait([_encode_key(k) for k in keys], self._timeout(timeout))

    def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        k = _encode_key(key)
        return self._server._local(lambda: self._server._op_delete(k))

    def append(self, key: str, value: bytes) -> None:
        """Append ``value`` to the bytes at ``key`` (creating it)."""
        k, v = _encode_key(key), _as_bytes(value)
        self._server._local(lambda: self._server._op_append(k, v))

    def num_keys(self) -> int:
        """How many keys the server holds (all namespaces, as torch's ``num_keys`` reports)."""
        return self._server._local(lambda: len(self._server._kv))

    def close(self) -> None:
        """Nothing to release: the server owns the data."""
