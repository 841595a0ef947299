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
  every other connection carry on. Replies a client does not read, connections that never
  validate, and who may connect at all are bounded (``docs/store-security.md``).
* :attr:`StoreServer.store` is an in-process view of the same data (a
  :class:`~launcher.store.api.KeyValueStore`) for the agent, sharing the key namespace that
  torch's clients use.

The pieces: :mod:`~launcher.store.protocol` (wire codec, shared with the client),
:mod:`~launcher.store.table` (keys, queues, waiters), :mod:`~launcher.store.requests` (one
connection and the requests it sends), :mod:`~launcher.store.loop` (the serving thread),
:mod:`~launcher.store.local` (the in-process view), :mod:`~launcher.store.admission` (who may
connect). This module is the public face: lifecycle, addresses, admission, in-process access.

Only the standard library is imported here: ``import torch`` costs more than a second.
See ``docs/store.md`` for the wire format.
"""

from __future__ import annotations

import contextlib
import logging
import math
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from launcher.addresses import lookup_name
from launcher.store.admission import (
    Admission,
    resolve_addresses,
)
from launcher.store.api import StoreError, StoreTimeoutError
from launcher.store.fd_limit import raise_open_files
from launcher.store.local import LocalStore
from launcher.store.loop import ACCEPT_PAUSE_S, LISTENER_TAG, WAKEUP_TAG, ServeLoop
from launcher.store.protocol import (
    KEY_PREFIX,
    VALIDATION_MAGIC,
    CheckResponse,
    QueryType,
    WaitResponse,
    format_address,
)
from launcher.store.requests import (
    Connection,
    RequestHandler,
)
from launcher.store.table import KeyTable
from launcher.store.throttle import LogThrottle

if TYPE_CHECKING:  # pragma: no cover
    from launcher.store.admission import IPAddress

__all__ = [
    "KEY_PREFIX",
    "Admission",
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


# The kernel clamps this to net.core.somaxconn; a large value lets a burst of thousands of
# simultaneous connects queue up instead of being refused.
_BACKLOG: Final = 65535

#: Seconds a new connection has to validate (and authenticate, when asked to) before it is closed.
HANDSHAKE_TIMEOUT: Final = 30.0
#: Seconds between two log lines about the same peer and the same kind of trouble.
LOG_INTERVAL: Final = 60.0
#: Seconds a refused would-be joiner counts in :meth:`StoreServer.knocking` (clients retry faster).
KNOCK_WINDOW: Final = 10.0
#: Seconds a spare that asked (SPARE_HELLO) counts as waiting (it asks every second or so).
SPARE_RECENT: Final = 3.0


class StoreServer(ServeLoop):
    """A TCPStore-compatible server running on one background thread.

    ``host``/``port`` say where to listen (``port=0``: the kernel picks a free port, read it back
    from :attr:`port` after :meth:`start`). ``host`` may be a name, an IPv4 or IPv6 literal
    (``"::1"``, ``"[::1]"``), or ``""``/``"::"`` for every interface (dual-stack where the
    system allows). Alternatively pass an already bound ``sock``; the server takes ownership and
    closes it in :meth:`close`.

    :meth:`start` also lifts this process's soft open-files limit towards the hard limit, since
    every connected client holds a descriptor: to what ``clients`` connections need (the nodes
    of a rendezvous) and at least 65,536. When the hard limit is too low for ``clients``, it
    logs one warning saying so then (see :mod:`launcher.store.fd_limit`).

    Use as a context manager, or call :meth:`start` and :meth:`close`::

        with StoreServer() as server:
            env["MASTER_ADDR"], env["MASTER_PORT"] = server.host, str(server.port)
            ...
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, sock: socket.socket | None = None, clients: int | None = None
    ) -> None:
        if not 0 <= port < 1 << 16:
            raise ValueError(f"port must be in [0, 65535], got {port}")
        self._requested_host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        self._requested_port = port
        #: Connections expected at once (the nodes of a rendezvous), for the open-files limit.
        self.clients = clients
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
        self._accept_pause = ACCEPT_PAUSE_S

        # Who may connect (see launcher.store.admission). None: members not fixed yet.
        self._admission = Admission()
        self._members: frozenset[IPAddress] | None = None
        self._authenticated_joiners = False
        # Peers refused only because the round is closed (see knocking()) -> when last refused.
        self._knocks: dict[IPAddress, float] = {}
        # The job has ended (end_job): refused spares asking (SPARE_HELLO) are told so.
        self._job_ended = False
        # Refused peers waiting as spares, not told yet that the job ended -> when they last asked.
        self._spares: dict[IPAddress, float] = {}
        self._recheck = False  # admission changed: the serving thread re-examines connections
        #: Seconds a new connection has to validate (and authenticate) before it is closed.
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        self._throttle = LogThrottle(log, LOG_INTERVAL)
        # Connections still in their handshake -> deadline (insertion order = deadline order).
        self._handshaking: dict[Connection, float] = {}
        self._probation: dict[Connection, float] = {}

        self._conns: set[Connection] = set()
        self._dirty: set[Connection] = set()  # connections with output queued outside their own turn

        self._table = KeyTable(self._release, self._written)
        self._requests = RequestHandler(self._table, lambda: self._admission.secret, self._validated)
        self._local_waiters = 0  # threads blocked in LocalStore waits
        self._on_writer_closed: Callable[[list[str], bool], None] | None = None
        self.keepalive: tuple[int, int, int] | None = None

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

    @property
    def client_count(self) -> int:
        """Connections open now (a stopped host waits for the others to hang up)."""
        return len(self._conns)

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

        problem = raise_open_files(self.clients)
        if problem is not None:
            log.warning("%s", problem)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, LISTENER_TAG)
        self._selector.register(self._wake_r, selectors.EVENT_READ, WAKEUP_TAG)

        self._thread = threading.Thread(target=self._serve, name=f"launcher-store-{self.port}", daemon=True)
        self._thread.start()
        log.debug("store server listening on %s", self.address)
        return self

    @property
    def admission(self) -> Admission:
        """The site's policy for peers while the round is open (default: anyone may connect).

        Set it before agents join, e.g. ``server.admission = Admission(join_networks=["10.0.0.0/8"],
        secret=b"...")``. Existing connections that the new policy would refuse, or that have
        not proven a secret it now requires, are closed.
        """
        return self._admission

    @admission.setter
    def admission(self, policy: Admission) -> None:
        if not isinstance(policy, Admission):
            raise TypeError(f"admission must be an Admission, not {type(policy).__name__}")
        with self._lock:
            self._admission = policy
            self._recheck = True
        self._poke()

    @property
    def log_interval(self) -> float:
        """Seconds between two log lines about the same peer and the same kind of trouble."""
        return self._throttle.interval

    @log_interval.setter
    def log_interval(self, seconds: float) -> None:
        self._throttle.interval = float(seconds)

    @property
    def members(self) -> frozenset[IPAddress] | None:
        """Addresses admitted by :meth:`restrict_to`; ``None`` while unrestricted."""
        return self._members

    def restrict_to(self, addresses: Iterable[str] | None, *, authenticated_joiners: bool = False) -> None:
        """Once a round is closed: admit only ``addresses`` (the members' hosts) and loopback.

        Names are resolved now (:class:`ValueError` when one does not resolve). Connections
        from any other address are refused at accept, and open ones are closed. A peer whose
        address is the one it reached (a process of this host connecting to one of its own
        addresses) counts as local, like loopback. With ``authenticated_joiners``, a peer in
        the join ranges that proves the shared secret is still admitted (an agent asking to
        join a running job); without a secret it changes nothing. ``None`` lifts the
        restriction (a new round opens). Workers' torch clients cannot authenticate: they are
        admitted by their host's address. Every call forgets :meth:`knocking`.
        """
        members = None if addresses is None else resolve_addresses(addresses)
        with self._lock:
            self._members = members
            self._authenticated_joiners = authenticated_joiners
            self._knocks.clear()
            self._recheck = True
        self._poke()
        if members is not None:
            log.debug("store server admits only %s and loopback", ", ".join(sorted(map(str, members))))

    def knocking(self, within: float = KNOCK_WINDOW) -> frozenset[IPAddress]:
        """Addresses refused in the last ``within`` seconds only because the store is restricted
        to a round's members: peers the site policy would admit to an open round (in the join
        ranges, and no secret configured). An agent arriving while a job runs is one of them;
        the rendezvous counts them as nodes waiting to join, when its round has room."""
        now = time.monotonic()
        with self._lock:
            for ip in [ip for ip, at in self._knocks.items() if now - at > within]:
                del self._knocks[ip]
            return frozenset(self._knocks)

    def end_job(self) -> None:
        """The job is over (its rendezvous is closed): from now on a refused agent waiting as a
        spare (``SPARE_HELLO``, see :mod:`launcher.store.admission`) is told so, and leaves."""
        with self._lock:
            self._job_ended = True

    @property
    def job_ended(self) -> bool:
        """Whether :meth:`end_job` was called."""
        return self._job_ended

    def untold_spares(self, within: float = SPARE_RECENT) -> frozenset[IPAddress]:
        """Refused agents waiting as spares that asked in the last ``within`` seconds and have
        not been told yet that the job ended (the host serves until they were, briefly)."""
        now = time.monotonic()
        with self._lock:
            return frozenset(ip for ip, at in self._spares.items() if now - at <= within)

    def outside_clients(self) -> int:
        """Open connections from peers that are not members of the round the store is restricted
        to (0 while unrestricted): spares and late nodes that proved the secret, waiting inside."""
        with self._lock:
            members = self._members
            if members is None:
                return 0
            return sum(1 for c in self._conns if c.authenticated and c.ip is not None and c.ip not in members)

    def on_writer_closed(self, match: Callable[[str], bool] | None, callback: Callable[[list[str], bool], None],
                         *, unreachable_after: float | None = None) -> None:
        """Tie keys to the connection that last wrote them, as ZooKeeper ties ephemeral nodes to
        a session: when a client connection closes (its process died, or it closed it),
        ``callback(keys, unreachable)`` gets the keys ``match`` accepts (client names) whose last
        write came from that connection. In-process writes (:attr:`store`) have no connection and
        are never reported; nor is anything when the server itself closes.

        ``callback`` runs on the serving thread with the server's lock held: it must only hand
        the keys on (to a thread of its own), never use this store. ``match=None`` stops it.
        A connection cut off without closing (a pulled cable, a crashed host) sends nothing; with
        ``unreachable_after`` (seconds), connections accepted from then on are probed by the
        kernel (TCP keep-alive) once idle, and one whose host has not answered for about that
        long is reported with ``unreachable`` true. A paused process (SIGSTOP) is not: its
        kernel still answers.
        """
        if unreachable_after is not None:
            # Never sooner than ``unreachable_after``: rounded up, to whole seconds as the kernel counts.
            idle = max(1, math.ceil(unreachable_after / 2))
            interval = max(1, math.ceil((unreachable_after - idle) / 3))
            self.keepalive = (idle, interval, 3)

        def track(raw: bytes) -> bool:
            return match is not None and match(raw.decode("utf-8", "replace").removeprefix(KEY_PREFIX))

        with self._lock:
            self._requests.track = track if match is not None else None
            self._on_writer_closed = callback if match is not None else None

    def discard_keys(self, keep_prefixes: tuple[str, ...] = ()) -> int:
        """Delete every key except those under ``keep_prefixes`` (keys as clients name them).

        A restarted worker group must not read what the previous attempt's workers wrote (a
        dead rank's address, say); torch avoids that by serving a new store per attempt, and a
        store that outlives attempts (the static backend's, on a fixed port) clears instead.
        Returns how many keys were deleted.
        """
        keep = tuple((KEY_PREFIX + prefix).encode() for prefix in keep_prefixes)

        return self.locked(lambda table: table.discard(keep))

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
                infos = socket.getaddrinfo(lookup_name(host), port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
                                           socket.AI_PASSIVE)
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

    # ------------------------------------------------------------------ in-process access

    def locked(self, fn: Callable[[KeyTable], _T]) -> _T:
        """Run ``fn(table)`` on the server's data with its lock held (what :class:`LocalStore`
        is built on). Keys are raw, with torch's ``/`` prefix. A :class:`ValueError` from ``fn``
        becomes a :class:`~launcher.store.api.StoreError`; replies to clients released by a
        write go out from the serving thread."""
        with self._lock:
            if self._closed:
                raise StoreError("store server is closed")
            try:
                result = fn(self._table)
            except ValueError as exc:
                raise StoreError(str(exc)) from exc
            queued = bool(self._dirty)
        if queued:
            self._poke()
        return result

    def wait_keys(self, keys: Sequence[bytes], timeout: float | None) -> None:
        """Block until every raw key exists; :class:`~launcher.store.api.StoreTimeoutError`
        after ``timeout`` seconds (``None``: forever), :class:`~launcher.store.api.StoreError`
        when the server closes meanwhile."""
        keys = list(keys)
        table = self._table
        with self._lock:
            if self._closed:
                raise StoreError("store server is closed")
            self._local_waiters += 1
            try:
                ok = self._cond.wait_for(lambda: self._closed or all(table.present(k) for k in keys), timeout)
            finally:
                self._local_waiters -= 1
            if self._closed:
                raise StoreError("store server closed while waiting")
        if not ok:
            raise StoreTimeoutError(f"timed out after {timeout} s waiting for keys {_describe(keys)}")


def _describe(keys: Sequence[bytes]) -> str:
    shown = ", ".join(repr(k.decode("utf-8", "replace").removeprefix(KEY_PREFIX)) for k in keys[:5])
    return f"[{shown}{', ...' if len(keys) > 5 else ''}]"
