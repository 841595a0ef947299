"""The store server's event loop: accepting, admitting, reading, executing, writing, closing.

:class:`ServeLoop` is the part of :class:`~launcher.store.server.StoreServer` that runs on its
serving thread: one :mod:`selectors` loop over non-blocking sockets, with no thread per client.
It is a base class only to keep modules short; it holds no state of its own, and the
attributes declared below are set up by ``StoreServer.__init__``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING, Final

from launcher.store.admission import (
    READER_HELLO,
    SPARE_ENDED,
    SPARE_HELLO,
    SPARE_RUNNING,
    Admission,
    Verdict,
    peer_ip,
)
from launcher.store.protocol import KEY_PREFIX, ProtocolError, format_address
from launcher.store.requests import (
    OUTPUT_HIGH_WATER,
    OUTPUT_LOW_WATER,
    STOP_WAITING,
    AuthError,
    Connection,
    Overflow,
    RequestHandler,
)
from launcher.store.table import Waiter
from launcher.store.throttle import LogThrottle

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from launcher.store.admission import IPAddress

__all__ = ["ACCEPT_PAUSE_S", "LISTENER_TAG", "WAKEUP_TAG", "ServeLoop"]

# The server's logger: operators filter on this name.
log = logging.getLogger("launcher.store.server")

# Bytes asked of one recv(). Python allocates the whole size for each call before the kernel
# fills it; past glibc's mmap threshold (128 KiB) every call then costs an mmap, an mremap and a
# munmap (about 15 us on this machine, seven times the read itself: most of the host's CPU in a
# 4,096-node round). 64 KiB stays on the heap; a larger request just takes a few more reads.
_RECV_SIZE: Final = 64 * 1024
# Accept at most this many connections per loop turn so a connection storm cannot starve
# requests from clients that are already connected.
_ACCEPT_BATCH: Final = 512
# Out of descriptors: stop accepting for this long, doubling while it lasts, up to the max.
ACCEPT_PAUSE_S: Final = 0.1
_ACCEPT_PAUSE_MAX_S: Final = 2.0

# At most this many refused would-be joiners are remembered (the oldest are forgotten first).
_MAX_KNOCKS: Final = 4096
# A refused peer that would count as a knock is heard for this long first: a reader
# (READER_HELLO, launcher status) is no agent waiting to join. Clients speak at once.
PROBATION_S: Final = 1.0
# At most this many refused peers are heard at a time; beyond, they count at once, as before.
_MAX_PROBATION: Final = 256

LISTENER_TAG: Final = object()
WAKEUP_TAG: Final = object()


class ServeLoop:
    """The serving thread's side of :class:`~launcher.store.server.StoreServer`."""

    _lock: threading.Lock
    _cond: threading.Condition
    _selector: selectors.BaseSelector | None
    _listener: socket.socket | None
    _wake_r: socket.socket | None
    _wake_w: socket.socket | None
    _stopping: bool
    _closed: bool
    _sockets_closed: bool
    _accept_paused_until: float | None
    _accept_pause: float
    _admission: Admission
    _members: frozenset[IPAddress] | None
    _authenticated_joiners: bool
    _knocks: dict[IPAddress, float]
    _probation: dict[Connection, float]
    _job_ended: bool
    _spares: dict[IPAddress, float]
    _recheck: bool
    handshake_timeout: float
    _throttle: LogThrottle
    _handshaking: dict[Connection, float]
    _conns: set[Connection]
    _dirty: set[Connection]
    _requests: RequestHandler
    _local_waiters: int
    _on_writer_closed: Callable[[list[str], bool], None] | None
    #: TCP keep-alive for accepted connections, ``(idle, interval, probes)`` seconds and count, or
    #: ``None`` (see :meth:`~launcher.store.server.StoreServer.on_writer_closed`).
    keepalive: tuple[int, int, int] | None

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
                events = sel.select(self._select_timeout())
                with self._lock:
                    if self._stopping:
                        break
                    now = time.monotonic()
                    paused_until = self._accept_paused_until
                    if paused_until is not None and now >= paused_until:
                        self._accept_paused_until = None
                        assert self._listener is not None
                        sel.register(self._listener, selectors.EVENT_READ, LISTENER_TAG)
                    self._expire_handshakes(now)
                    self._expire_probation(now)
                    if self._recheck:
                        self._recheck = False
                        self._enforce_admission()
                    for key, mask in events:
                        try:
                            self._dispatch(key.data, mask)
                        except Exception:  # a bug here must not take the whole store down
                            log.exception("store server: unexpected error; dropping that connection")
                            if isinstance(key.data, Connection):
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

    def _select_timeout(self) -> float | None:
        deadlines = []
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        if self._handshaking:
            deadlines.append(next(iter(self._handshaking.values())))
        if self._probation:
            deadlines.append(next(iter(self._probation.values())))
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _expire_handshakes(self, now: float) -> None:
        """Close connections that have not validated (or authenticated) in time: a peer that
        connects and never speaks must not hold its slot forever."""
        while self._handshaking:
            conn, deadline = next(iter(self._handshaking.items()))
            if deadline > now:
                return
            self._throttle.log(
                logging.WARNING,
                (conn.ip, "handshake"),
                "store client %s did not complete its handshake within %g s; closing it",
                conn.who,
                self.handshake_timeout,
            )
            self._drop(conn)

    def _verdict(self, ip: IPAddress | None, local: IPAddress | None = None) -> Verdict:
        if ip is not None and ip == local:
            # A process of this host that reached one of its own addresses: as local as loopback.
            return Verdict.ADMIT
        return self._admission.verdict(ip, self._members, self._authenticated_joiners)

    def _may_knock(self, ip: IPAddress | None) -> bool:
        """Whether refusing ``ip`` now may count it as an agent waiting to join (see :meth:`_note_knock`)."""
        return ip is not None and self._members is not None and self._admission.verdict(ip, None) is Verdict.ADMIT

    def _note_knock(self, ip: IPAddress | None) -> None:
        """Remember a peer refused only because the store is restricted to a round's members."""
        if ip is None or not self._may_knock(ip):
            return
        self._knocks.pop(ip, None)
        self._knocks[ip] = time.monotonic()
        while len(self._knocks) > _MAX_KNOCKS:
            del self._knocks[next(iter(self._knocks))]

    def _enforce_admission(self) -> None:
        """Close connections the current policy no longer admits."""
        for conn in list(self._conns):
            if conn in self._probation:
                continue  # refused already: heard out by _on_readable or _expire_probation
            verdict = self._verdict(conn.ip, _local_ip(conn.sock))
            if verdict is Verdict.AUTHENTICATE and conn.must_auth and conn in self._handshaking:
                # Proving the secret right now (a spare connecting as the round closes): it
                # gets its handshake's time; a wrong or missing proof closes it then.
                continue
            if verdict is Verdict.REFUSE or (verdict is Verdict.AUTHENTICATE and not conn.authenticated):
                self._refused(conn.ip, conn.who, verdict)
                self._drop(conn)

    def _refused(self, ip: IPAddress | None, who: str, verdict: Verdict) -> None:
        level = logging.WARNING
        if verdict is Verdict.AUTHENTICATE:
            why = "it has not proven the shared secret"
        elif not self._admission.in_join_networks(ip):
            why = "it is outside join_networks"
        elif self._admission.secret is None:
            # Maybe an agent joining a running job (see StoreServer.knocking): not trouble yet.
            level = logging.INFO
            why = "it is not a member of the current round (an agent may join when a new round opens)"
        else:
            why = "it is not a member of the current round"
        self._throttle.log(level, (ip, "refused"), "store server refused %s: %s", who, why)

    def _dispatch(self, data: object, mask: int) -> None:
        if data is LISTENER_TAG:
            self._accept()
        elif data is WAKEUP_TAG:
            assert self._wake_r is not None
            try:
                while self._wake_r.recv(4096):
                    pass
            except OSError:
                pass
        elif isinstance(data, Connection) and not data.closed:
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
                    # stop watching it for a while (longer each time it recurs) instead of spinning.
                    self._throttle.log(
                        logging.WARNING,
                        ("accept", exc.errno),
                        "store server cannot accept connections: %s; pausing accepts for %.1f s",
                        exc,
                        self._accept_pause,
                    )
                    self._selector.unregister(self._listener)
                    self._accept_paused_until = time.monotonic() + self._accept_pause
                    self._accept_pause = min(self._accept_pause * 2, _ACCEPT_PAUSE_MAX_S)
                    return
                if exc.errno == errno.ECONNABORTED:
                    continue
                log.warning("store server accept failed: %s", exc)
                return
            self._accept_pause = ACCEPT_PAUSE_S
            ip = peer_ip(peer)
            verdict = self._verdict(ip, _local_ip(sock))
            if verdict is Verdict.REFUSE and self._may_knock(ip) and len(self._probation) < _MAX_PROBATION:
                # Heard before it counts: its first byte says whether it is a reader.
                sock.setblocking(False)
                conn = Connection(sock, peer, ip)
                self._selector.register(sock, selectors.EVENT_READ, conn)
                self._conns.add(conn)
                self._probation[conn] = time.monotonic() + PROBATION_S
                continue
            if verdict is Verdict.REFUSE:
                self._note_knock(ip)
                self._refused(ip, format_address(str(ip), int(peer[1])) if ip else str(peer), verdict)
                with contextlib.suppress(OSError):
                    sock.close()
                continue
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                # Replies are tiny and latency-bound; do not let Nagle hold them back.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.keepalive is not None:
                    _keep_alive(sock, self.keepalive)
            conn = Connection(sock, peer, ip)
            conn.must_auth = verdict is Verdict.AUTHENTICATE
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._conns.add(conn)
            self._handshaking[conn] = time.monotonic() + self.handshake_timeout

    def _expire_probation(self, now: float) -> None:
        """Refused peers that said nothing in time: counted as knocking agents, as before probation."""
        while self._probation:
            conn, deadline = next(iter(self._probation.items()))
            if deadline > now:
                return
            self._end_probation(conn, reader=False)

    def _end_probation(self, conn: Connection, *, reader: bool) -> None:
        self._probation.pop(conn, None)
        if reader:
            self._throttle.log(logging.INFO, (conn.ip, "reader"), "store server refused the reader %s: it is not "
                               "a member of the current round", conn.who)
        else:
            self._note_knock(conn.ip)
            self._refused(conn.ip, conn.who, Verdict.REFUSE)
        self._drop(conn)

    def _answer_spare(self, conn: Connection) -> None:
        """A refused peer that waits as a spare (``SPARE_HELLO``): counted as a node waiting to
        join, like any knocking agent, and told only whether the job runs or has ended."""
        self._probation.pop(conn, None)
        self._note_knock(conn.ip)
        ended = self._job_ended
        if conn.ip is not None:
            # Remembered until told the job ended (the host serves a moment longer for it).
            self._spares.pop(conn.ip, None)
            if not ended:
                self._spares[conn.ip] = time.monotonic()
                while len(self._spares) > _MAX_KNOCKS:
                    del self._spares[next(iter(self._spares))]
        self._throttle.log(logging.INFO, (conn.ip, "spare", ended), "store server refused %s, which waits as a "
                           "spare: it is not a member of the current round; told the job %s", conn.who,
                           "has ended" if ended else "runs")
        with contextlib.suppress(OSError):  # one byte on a fresh connection: the buffer takes it
            conn.sock.send(bytes([SPARE_ENDED if ended else SPARE_RUNNING]))
        self._drop(conn)

    def _on_readable(self, conn: Connection) -> None:
        if conn in self._probation:
            try:
                first = conn.sock.recv(1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                first = b""
            if first == bytes([SPARE_HELLO]):
                self._answer_spare(conn)
                return
            self._end_probation(conn, reader=first == bytes([READER_HELLO]))
            return
        try:
            data = conn.sock.recv(_RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.debug("store client %s: %s", conn.who, exc)
            self._drop(conn, peer_gone=True, unreachable=exc.errno == errno.ETIMEDOUT)
            return
        if not data:
            self._drop(conn, peer_gone=True)
            return
        conn.inbuf += data
        self._run_requests(conn)

    def _run_requests(self, conn: Connection) -> None:
        """Execute the complete requests buffered on ``conn``, then send what they produced."""
        try:
            self._requests.process(conn)
        except ProtocolError as exc:
            self._fail(conn, exc)
            return
        if not conn.closed:
            self._flush(conn)

    def _fail(self, conn: Connection, exc: ProtocolError) -> None:
        """Log (throttled, per peer and kind) why ``conn`` is closed, and close it."""
        if isinstance(exc, AuthError):
            what, kind = "failed authentication", "auth"
        elif isinstance(exc, Overflow):
            what, kind = "asked for too much", "overflow"
        elif conn.validated:
            what, kind = "sent a malformed request", "malformed"
        else:
            what, kind = "is not a TCPStore client", "validation"
        self._throttle.log(logging.WARNING, (conn.ip, kind), "store client %s %s (%s); closing it", conn.who, what, exc)
        self._drop(conn)

    def _flush(self, conn: Connection) -> None:
        while not conn.closed:
            if conn.outbuf:
                try:
                    sent = conn.sock.send(conn.outbuf)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError as exc:
                    log.debug("store client %s: %s", conn.who, exc)
                    self._drop(conn, peer_gone=True, unreachable=exc.errno == errno.ETIMEDOUT)
                    return
                del conn.outbuf[:sent]
            if conn.paused and len(conn.outbuf) <= OUTPUT_LOW_WATER:
                # The peer caught up: run the requests held back, which may refill outbuf.
                conn.paused = False
                try:
                    self._requests.process(conn)
                except ProtocolError as exc:
                    self._fail(conn, exc)
                    return
                continue  # send what they produced before deciding what to watch
            break
        if conn.closed:
            return
        if len(conn.outbuf) >= OUTPUT_HIGH_WATER:
            conn.paused = True
        events = (0 if conn.paused else selectors.EVENT_READ) | (selectors.EVENT_WRITE if conn.outbuf else 0)
        if events != conn.events and self._selector is not None:
            self._selector.modify(conn.sock, events, conn)
            conn.events = events

    def _flush_dirty(self) -> None:
        while self._dirty:
            self._flush(self._dirty.pop())

    def _drop(self, conn: Connection, *, peer_gone: bool = False, unreachable: bool = False) -> None:
        """Close ``conn``; ``peer_gone``: the peer closed it (or its end broke), not the server."""
        if conn.closed:
            return
        conn.closed = True
        self._requests.clear_wait(conn)
        written = self._requests.writer_closed(conn)
        if written and peer_gone:  # a connection the server closed (a bad request...) is no death
            self._writer_gone(written, unreachable)
        self._conns.discard(conn)
        self._dirty.discard(conn)
        self._handshaking.pop(conn, None)
        self._probation.pop(conn, None)
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    # ------------------------------------------------------------------ waiting

    def _release(self, waiter: Waiter) -> None:
        conn = waiter.owner
        assert isinstance(conn, Connection)
        conn.waiter = None
        # Not _send: one byte per wait cannot pile up, and a writer must never fail because
        # of someone else's backlog.
        conn.outbuf += STOP_WAITING
        self._dirty.add(conn)

    def _validated(self, conn: Connection) -> None:
        self._handshaking.pop(conn, None)

    def _writer_gone(self, raw_keys: list[bytes], unreachable: bool = False) -> None:
        """A client that was the last writer of tracked keys went away (lock held): tell the
        owner of the hook, unless the server itself is closing (that is no client's death)."""
        callback = self._on_writer_closed
        if callback is None or self._stopping:
            return
        keys = [k.decode("utf-8", "replace").removeprefix(KEY_PREFIX) for k in raw_keys]
        try:
            callback(keys, unreachable)
        except Exception:  # the hook's bug must not take the store down
            log.exception("store server: the closed-writer hook failed")

    def _written(self) -> None:
        if self._local_waiters:
            self._cond.notify_all()


def _keep_alive(sock: socket.socket, keepalive: tuple[int, int, int]) -> None:
    """Have the kernel probe an idle connection: a peer whose host stops answering (a pulled
    cable, a powered-off host) then ends in ETIMEDOUT, while a live but paused process's kernel
    still answers the probes, so its connection stays. Probes are sent only while nothing is
    unacknowledged: a reply in flight when the cable was pulled would leave the connection to
    TCP's retransmissions (many minutes), so TCP_USER_TIMEOUT ends it after the same time."""
    idle, interval, probes = keepalive
    with contextlib.suppress(OSError, AttributeError):  # TCP_KEEP* are Linux's (and a few others')
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 1000 * (idle + interval * probes))


def _local_ip(sock: socket.socket) -> IPAddress | None:
    """The address a connection reached on this host (``None`` when it cannot be read)."""
    try:
        return peer_ip(sock.getsockname())
    except OSError:
        return None
