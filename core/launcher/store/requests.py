"""One client connection, and the execution of the requests it sends.

:class:`RequestHandler` parses requests from a :class:`Connection`'s input buffer and runs them
against the :class:`~launcher.store.table.KeyTable`, appending the replies to the connection's
output buffer; :class:`~launcher.store.server.StoreServer` owns the sockets and sends them.
Everything here runs with the server's lock held.
"""

from __future__ import annotations

import selectors
import socket
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final

from launcher.store.admission import (
    AUTH_HELLO,
    AUTH_PROOF,
    NONCE_LEN,
    PROOF_LEN,
    READER_HELLO,
    SPARE_ADMITTED,
    SPARE_HELLO,
    SPARE_PROVE,
    client_proof,
    new_nonce,
    proofs_match,
    server_proof,
)
from launcher.store.protocol import (
    I64,
    U32,
    VALIDATION_MAGIC,
    CheckResponse,
    NeedMore,
    ProtocolError,
    QueryType,
    Reader,
    WaitResponse,
    format_address,
    pack_blob,
)
from launcher.store.table import KeyTable, Waiter

if TYPE_CHECKING:  # pragma: no cover
    from launcher.store.admission import IPAddress

__all__ = [
    "OUTPUT_HARD_LIMIT",
    "OUTPUT_HIGH_WATER",
    "OUTPUT_LOW_WATER",
    "STOP_WAITING",
    "AuthError",
    "Connection",
    "Overflow",
    "RequestHandler",
]

# Bounded memory per connection. A client that sends requests but does not read the replies
# (pipelined GETs of a large value, say) would otherwise make us queue replies without end.
# Past the high-water mark we stop executing its requests and stop reading its socket (the
# kernel's buffers then push back on the sender) until it has read down to the low-water mark.
OUTPUT_HIGH_WATER: Final = 2 << 20
OUTPUT_LOW_WATER: Final = 256 << 10
# A reply that would grow an already non-empty backlog past this, or a multi-key reply larger
# than this, closes the connection: one small request must not buy an unbounded reply.
OUTPUT_HARD_LIMIT: Final = 64 << 20
STOP_WAITING: Final = bytes([WaitResponse.STOP_WAITING])
_WAIT_CANCELED: Final = bytes([WaitResponse.WAIT_CANCELED])


class AuthError(ProtocolError):
    """The peer did not prove the shared secret; its connection is closed."""


class Overflow(ProtocolError):
    """A reply would exceed :data:`OUTPUT_HARD_LIMIT`; the connection is closed."""


class Connection:
    """One client connection's state (touched only with the server lock held)."""

    __slots__ = (
        "sock",
        "peer",
        "ip",
        "inbuf",
        "outbuf",
        "validated",
        "waiter",
        "closed",
        "events",
        "paused",
        "must_auth",
        "authenticated",
        "nonces",
        "written",
    )

    def __init__(self, sock: socket.socket, peer: object, ip: IPAddress | None) -> None:
        self.sock = sock
        self.peer = peer
        self.ip = ip
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.validated = False
        self.waiter: Waiter | None = None
        self.closed = False
        self.events = selectors.EVENT_READ  # what the selector watches for
        self.paused = False  # reading stopped: replies are not being read
        self.must_auth = False  # must prove the shared secret before anything else
        self.authenticated = False
        self.nonces: tuple[bytes, bytes] | None = None  # (client, server) once AUTH_HELLO came
        self.written: set[bytes] | None = None  # tracked keys this connection wrote (see RequestHandler.track)

    @property
    def who(self) -> str:
        """The peer's address for log lines."""
        if isinstance(self.peer, tuple) and len(self.peer) >= 2:
            # An IPv4 peer of a dual-stack listener is named as IPv4, not ::ffff:a.b.c.d.
            return format_address(str(self.ip or self.peer[0]), int(self.peer[1]))
        return str(self.peer or "local socket")


class RequestHandler:
    """Runs the requests buffered on connections against ``table``.

    ``secret()`` gives the shared secret now configured (or ``None``); ``validated(conn)`` is
    called once a connection has sent a valid VALIDATE.
    """

    def __init__(
        self,
        table: KeyTable,
        secret: Callable[[], bytes | None],
        validated: Callable[[Connection], None],
    ) -> None:
        self._table = table
        self._secret = secret
        self._validated = validated
        #: Keys whose last writer is remembered (see :meth:`writer_closed`); ``None``: none.
        self.track: Callable[[bytes], bool] | None = None
        self._last_writer: dict[bytes, Connection] = {}
        self._handlers: dict[int, Callable[[Connection, Reader], None]] = {
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
            AUTH_HELLO: self._q_auth_hello,
            AUTH_PROOF: self._q_auth_proof,
            READER_HELLO: self._q_reader_hello,
            SPARE_HELLO: self._q_spare_hello,
        }

    def process(self, conn: Connection) -> None:
        """Run the complete requests in ``conn.inbuf`` (consuming them), until the input ends
        mid-message or the replies reach :data:`OUTPUT_HIGH_WATER` (then ``conn.paused`` is
        set). Raises :class:`~launcher.store.protocol.ProtocolError` (or a subclass) when the
        peer breaks the protocol; the caller closes the connection."""
        buf = conn.inbuf
        pos = 0
        try:
            # Stop at the high-water mark: the rest waits in inbuf until the peer reads.
            while pos < len(buf) and not conn.closed and len(conn.outbuf) < OUTPUT_HIGH_WATER:
                reader = Reader(buf, pos)
                try:
                    query = reader.u8()
                    if conn.must_auth and query not in (AUTH_HELLO, AUTH_PROOF, READER_HELLO, SPARE_HELLO):
                        raise AuthError(f"query {query} before proving the shared secret")
                    if not conn.validated and query not in (QueryType.VALIDATE, AUTH_HELLO, AUTH_PROOF,
                                                            READER_HELLO, SPARE_HELLO):
                        raise ProtocolError(f"expected a validation message first, got query {query}")
                    handler = self._handlers.get(query)
                    if handler is None:
                        raise ProtocolError(f"unknown query type {query}")
                    # Handlers read all their fields before changing anything, so running out of
                    # bytes (NeedMore) never leaves a half-executed request.
                    handler(conn, reader)
                except NeedMore:
                    break
                except ValueError as exc:  # e.g. ADD on a value that is not an integer
                    raise ProtocolError(str(exc)) from exc
                pos = reader.pos
        finally:
            if pos:
                del buf[:pos]
            if len(conn.outbuf) >= OUTPUT_HIGH_WATER:
                conn.paused = True  # requests may be left in inbuf: the loop resumes once it drains

    @staticmethod
    def _send(conn: Connection, data: bytes) -> None:
        if conn.outbuf and len(conn.outbuf) + len(data) > OUTPUT_HARD_LIMIT:
            raise Overflow(f"{len(conn.outbuf)} bytes of replies are waiting to be read")
        conn.outbuf += data

    # ------------------------------------------------------------------ waiting

    def _register_wait(self, conn: Connection, keys: Iterable[bytes], *, next_write: bool = False) -> bool:
        """Make ``conn`` wait for ``keys``; whether it has to (False: all exist already)."""
        # torch's client never has two waits in flight on one connection; if a peer does, the
        # newer one replaces the older.
        self.clear_wait(conn)
        conn.waiter = self._table.wait(conn, keys, next_write=next_write)
        return conn.waiter is not None

    def clear_wait(self, conn: Connection) -> None:
        """Forget what ``conn`` was waiting for (it cancelled, or went away)."""
        if conn.waiter is not None:
            self._table.cancel(conn.waiter)
            conn.waiter = None

    # ------------------------------------------------------------------ writers

    def _wrote(self, conn: Connection, key: bytes) -> None:
        """Remember ``conn`` as the last writer of ``key`` when ``key`` is tracked."""
        if self.track is None or not self.track(key):
            return
        self._last_writer[key] = conn
        if conn.written is None:
            conn.written = set()
        conn.written.add(key)

    def writer_closed(self, conn: Connection) -> list[bytes]:
        """``conn`` went away: the tracked keys it was the last writer of (raw), now forgotten."""
        if not conn.written:
            return []
        mine = sorted(key for key in conn.written if self._last_writer.get(key) is conn)
        for key in mine:
            del self._last_writer[key]
        conn.written = None
        return mine

    # ------------------------------------------------------------------ request handlers

    def _q_validate(self, conn: Connection, r: Reader) -> None:
        magic = r.u32()
        if magic != VALIDATION_MAGIC:
            raise ProtocolError(f"bad validation number {magic:#x}")
        conn.validated = True
        self._validated(conn)

    def _q_reader_hello(self, conn: Connection, r: Reader) -> None:
        # An admitted reader: nothing to do (the loop looks at it only on a refused connection).
        pass

    def _q_spare_hello(self, conn: Connection, r: Reader) -> None:
        # An admitted would-be spare (a new round opened since it was refused): it goes on with
        # its handshake here. One that must prove a secret it does not have is told so. (A
        # refused one is answered by the loop, on probation: launcher.store.loop.)
        self._send(conn, bytes([SPARE_PROVE if conn.must_auth else SPARE_ADMITTED]))

    def _q_auth_hello(self, conn: Connection, r: Reader) -> None:
        # Reply: u8 1 when no secret is configured; else u8 0, our nonce and our proof.
        client_nonce = r.fixed(NONCE_LEN)
        secret = self._secret()
        if secret is None:
            self._send(conn, b"\x01")
            return
        server_nonce = new_nonce()
        conn.nonces = (client_nonce, server_nonce)
        self._send(conn, b"\x00" + server_nonce + server_proof(secret, client_nonce, server_nonce))

    def _q_auth_proof(self, conn: Connection, r: Reader) -> None:
        proof = r.fixed(PROOF_LEN)
        secret = self._secret()
        if conn.nonces is None or secret is None:
            raise AuthError("proof without a challenge")
        client_nonce, server_nonce = conn.nonces
        conn.nonces = None  # one proof per challenge
        if not proofs_match(proof, client_proof(secret, server_nonce, client_nonce)):
            raise AuthError("wrong proof of the shared secret")
        conn.must_auth = False
        conn.authenticated = True
        self._send(conn, b"\x00")

    def _q_ping(self, conn: Connection, r: Reader) -> None:
        nonce = r.u32()
        self._send(conn, U32.pack(nonce))

    def _q_set(self, conn: Connection, r: Reader) -> None:
        key, value = r.key(), r.value()
        self._table.set(key, value)
        self._wrote(conn, key)

    def _q_compare_set(self, conn: Connection, r: Reader) -> None:
        key, expected, desired = r.key(), r.value(), r.value()
        self._send(conn, pack_blob(self._table.compare_set(key, expected, desired)))
        self._wrote(conn, key)

    def _q_get(self, conn: Connection, r: Reader) -> None:
        # The client waits for the key first; a missing key reads as empty, like torch's server.
        key = r.key()
        self._send(conn, pack_blob(self._table.get(key)))

    def _q_add(self, conn: Connection, r: Reader) -> None:
        key, amount = r.key(), r.i64()
        self._send(conn, I64.pack(self._table.add(key, amount)))
        if amount:  # add(key, 0) is how counters are read
            self._wrote(conn, key)

    def _q_check(self, conn: Connection, r: Reader) -> None:
        keys = r.keys()
        ready = all(self._table.present(k) for k in keys)
        self._send(conn, bytes([CheckResponse.READY if ready else CheckResponse.NOT_READY]))

    def _q_wait(self, conn: Connection, r: Reader) -> None:
        keys = r.keys()
        if not self._register_wait(conn, keys):
            self._send(conn, STOP_WAITING)

    def _q_cancel_wait(self, conn: Connection, r: Reader) -> None:
        # If the wait already completed, STOP_WAITING went out first; the client expects both.
        self.clear_wait(conn)
        self._send(conn, _WAIT_CANCELED)

    def _q_num_keys(self, conn: Connection, r: Reader) -> None:
        self._send(conn, I64.pack(self._table.num_keys()))

    def _q_delete(self, conn: Connection, r: Reader) -> None:
        key = r.key()
        self._send(conn, I64.pack(1 if self._table.delete(key) else 0))

    def _q_append(self, conn: Connection, r: Reader) -> None:
        key, value = r.key(), r.value()
        self._table.append(key, value)

    def _q_multi_get(self, conn: Connection, r: Reader) -> None:
        keys = r.keys()
        size = sum(8 + len(self._table.get(k)) for k in keys)
        if size > OUTPUT_HARD_LIMIT:
            raise Overflow(f"MULTI_GET reply of {size} bytes")
        self._send(conn, b"".join(pack_blob(self._table.get(k)) for k in keys))

    def _q_multi_set(self, conn: Connection, r: Reader) -> None:
        pairs = [(r.key(), r.value()) for _ in range(r.count())]
        for key, value in pairs:
            self._table.set(key, value)
            self._wrote(conn, key)

    def _q_queue_push(self, conn: Connection, r: Reader) -> None:
        key, value = r.key(), r.value()
        self._table.queue_push(key, value)

    def _q_queue_pop(self, conn: Connection, r: Reader) -> None:
        # Reply: the queue's length before the pop, then the item when there was one.
        key = r.key()
        length, item = self._table.queue_pop(key)
        self._send(conn, I64.pack(length) if item is None else I64.pack(length) + pack_blob(item))

    def _q_queue_len(self, conn: Connection, r: Reader) -> None:
        key = r.key()
        self._send(conn, I64.pack(self._table.queue_len(key)))

    def _q_list_keys(self, conn: Connection, r: Reader) -> None:
        keys = list(self._table.kv)
        size = sum(8 + len(k) for k in keys)
        if size > OUTPUT_HARD_LIMIT:
            raise Overflow(f"LIST_KEYS reply of {size} bytes")
        self._send(conn, I64.pack(len(keys)) + b"".join(pack_blob(k) for k in keys))

    def _q_barrier(self, conn: Connection, r: Reader) -> None:
        # The key holds the arrival count as a decimal string. Arrivals before the last one
        # block; the last one releases everybody (and anyone in WAIT on the key).
        key, world_size = r.key(), r.i64()
        if self._table.barrier(key, world_size):
            self._send(conn, STOP_WAITING)
        else:
            self._register_wait(conn, [key], next_write=True)
