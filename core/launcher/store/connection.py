"""Opening a client connection to a TCPStore-protocol server: retry, handshake, authentication.

:func:`open_connection` is what :class:`~launcher.store.client.TCPStoreClient` does on its first
call and after every dropped connection: connect (every address the host resolves to), prove the
shared secret when it has one (:mod:`launcher.store.admission`), then validate and ping the way
torch's own client does, retrying with jittered backoff until the connect timeout passes.
:class:`Deadline` bounds every blocking socket call of the client.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from typing import Final

from launcher.addresses import format_address
from launcher.store.admission import (
    AUTH_HELLO,
    AUTH_PROOF,
    NONCE_LEN,
    PROOF_LEN,
    READER_HELLO,
    SPARE_ADMITTED,
    SPARE_ENDED,
    SPARE_HELLO,
    SPARE_RUNNING,
    client_proof,
    new_nonce,
    proofs_match,
    server_proof,
)
from launcher.store.api import StoreError
from launcher.store.protocol import U8, U32, VALIDATION_MAGIC, QueryType

__all__ = [
    "SPARE_POLL_S",
    "Deadline",
    "JobEnded",
    "SpareStoreGone",
    "open_connection",
    "reachability_problem",
    "recv_exact",
]

log = logging.getLogger("launcher.store.client")

_MAX_RETRY_DELAY_S: Final = 1.0
#: Seconds between two questions of a refused agent waiting as a spare (``SPARE_HELLO``).
SPARE_POLL_S: Final = 1.0
#: Seconds the store has to answer a ``SPARE_HELLO``.
_SPARE_REPLY_S: Final = 5.0


class Deadline:
    """A point in time (or none: wait forever) that blocking socket calls count down to."""

    __slots__ = ("at",)

    def __init__(self, seconds: float | None) -> None:
        self.at = None if seconds is None else time.monotonic() + max(0.0, seconds)

    def remaining(self) -> float | None:
        """Seconds left; raises :class:`TimeoutError` once it has passed."""
        if self.at is None:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left


class _Refused(StoreError):
    """The server turned us away; ``final`` when retrying cannot help (a secret mismatch)."""

    def __init__(self, message: str, final: bool = True) -> None:
        super().__init__(message)
        self.final = final


class JobEnded(StoreError):
    """The store refused this client as a spare of a running job, then said the job has ended
    (``SPARE_ENDED``): it was not needed."""


class SpareStoreGone(StoreError):
    """The store refused this client as a spare of a running job (``SPARE_RUNNING``), then went
    away without saying the job ended (its host died or was cut off)."""


class _StillRunning(Exception):
    """The store answered ``SPARE_RUNNING``: ask again later (internal to :func:`open_connection`)."""


#: Seconds a fresh connection must stay open to count as a live store.
ALIVE_WAIT = 0.5


def reachability_problem(host: str, port: int, timeout: float = 2.0) -> str | None:
    """Why a fresh TCP connection to ``host:port`` fails, or ``None`` when one succeeds.

    Asked after a store call failed, to tell a store that is gone (refused: nothing listens any
    more) or cut off (no answer) from a passing hiccup.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            # A process being killed may still hold its listening socket for a moment: the
            # kernel completes the handshake, then resets the connection as the socket closes.
            # A live store sends nothing unasked and keeps the connection open, so a short
            # wait tells the two apart.
            sock.settimeout(ALIVE_WAIT)
            try:
                closed = sock.recv(1) == b""
            except TimeoutError:
                return None
            return "the connection was closed at once (the store's process is ending)" if closed else None
    except TimeoutError:
        return f"no answer within {timeout:g} s (host down or network cut)"
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def recv_exact(sock: socket.socket, n: int, deadline: Deadline) -> bytes:
    """Exactly ``n`` bytes from ``sock`` before ``deadline``; :class:`ConnectionError` when the
    server closes the connection first, :class:`TimeoutError` when the deadline passes."""
    sock.settimeout(deadline.remaining())
    first = sock.recv(n)
    if len(first) == n:
        return first
    if not first:
        raise ConnectionError("the store closed the connection")
    # A large value (a big round's sealed record) arrives in pieces: receive them in place.
    buf = bytearray(n)
    view = memoryview(buf)
    got = len(first)
    view[:got] = first
    while got < n:
        sock.settimeout(deadline.remaining())
        size = sock.recv_into(view[got:])
        if not size:
            raise ConnectionError("the store closed the connection")
        got += size
    return bytes(buf)


def open_connection(
    host: str,
    port: int,
    *,
    connect_timeout: float | None,
    secret: bytes | None,
    refused_timeout: float | None = None,
    reader: bool = False,
    spare: bool = False,
    gone_timeout: float | None = None,
) -> socket.socket:
    """A validated connection to the store at ``host:port``, retrying until ``connect_timeout``
    (seconds, ``None``: forever) passes; then :class:`StoreError` naming the address, the timeout
    and the last error. A secret the server does not share fails at once.

    ``refused_timeout`` (seconds from now; ``None``: the same as ``connect_timeout``) is how long
    to keep trying while the server accepts connections and closes them at once: it does not
    admit this address now (a store restricted to a running round's members, see
    ``docs/store-security.md``), which may change when a new round opens.
    """
    address = format_address(host, port)
    deadline = Deadline(connect_timeout)
    refused_deadline = deadline if refused_timeout is None else Deadline(refused_timeout)
    delay = 0.01
    attempts = 0
    refused = False  # the last attempt was accepted, then closed before the handshake ended
    told = False
    last_error: BaseException | None = None
    probe = False  # ask as a would-be spare first (SPARE_HELLO): the store refused us once
    at_once = False  # the first such question goes without a pause
    unanswered = False  # a question as a spare was refused without an answer (not a launcher store?)
    waiting = False  # the store said the job runs without us: we wait as a spare
    forever = Deadline(None)
    gone = deadline  # once waiting: how long the store may stop answering

    def pick() -> Deadline:
        if waiting:
            return forever if refused else gone
        return refused_deadline if refused else deadline

    while True:
        active = pick()
        try:
            left = active.remaining()
        except TimeoutError:
            break
        attempts += 1
        if waiting and left is None:
            # A spare waits for as long as the job runs, but each try is bounded: a store cut off
            # must not hold a connect (or a reply) for the kernel's minutes.
            active = Deadline(_SPARE_REPLY_S)
            left = active.remaining()
        sock: socket.socket | None = None
        try:
            # create_connection tries every address the host resolves to (IPv4 and IPv6).
            sock = socket.create_connection((host, port), timeout=left)
        except OSError as exc:
            # Nothing listens, no route, no answer: the store is not there (yet).
            refused = False
            last_error = exc
        else:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if probe:
                    _ask_as_spare(sock, address, active)
                _handshake(sock, address, active, secret, reader)
                return sock
            except _StillRunning:
                sock.close()
                if not waiting:
                    log.warning(
                        "the store at %s admits only the running job's nodes (its round is full or closed, and "
                        "no secret is configured): this node waits as a spare, counted by the job; it joins when "
                        "a new round admits it, and leaves when the job ends",
                        address,
                    )
                waiting, refused, last_error = True, True, None
                gone = Deadline(connect_timeout if gone_timeout is None else gone_timeout)
                time.sleep(SPARE_POLL_S * random.uniform(0.8, 1.0))
                continue
            except JobEnded:
                sock.close()
                raise
            except _Refused as exc:
                sock.close()
                # A secret mismatch will not fix itself; a refused address might (the round
                # may reopen), so that one keeps retrying.
                if exc.final:
                    raise
                refused, last_error = True, exc
            except ConnectionError as exc:
                # Accepted, then closed before answering: this address is not admitted now.
                sock.close()
                refused, last_error = True, exc
                unanswered = unanswered or (probe and not waiting)  # a store that ignores SPARE_HELLO
                if spare and secret is None and not reader and not probe:
                    probe = at_once = True
            except (OSError, StoreError) as exc:
                # TimeoutError is an OSError: a deadline passing mid-attempt lands here too.
                sock.close()
                refused, last_error = False, exc
        quiet = waiting or (probe and not unanswered)  # a spare's own line says it (above)
        if refused and not told and not quiet and refused_deadline is not deadline and refused_timeout:
            told = True  # (refused_timeout 0: no retrying)
            log.info(
                "the store at %s does not admit this host now (it closes our connections at once: a running "
                "job admits only its nodes); retrying until it does, as a spare or a late node, once a new "
                "round opens",
                address,
            )
        active = pick()
        try:
            left = active.remaining()
        except TimeoutError:
            break
        if at_once:
            at_once = False
            continue  # ask as a spare at once: the answer is the line the operator waits for
        pause = delay * random.uniform(0.5, 1.0)  # jitter: clients must not retry in lockstep
        time.sleep(pause if left is None else min(pause, left))
        delay = min(delay * 2, _MAX_RETRY_DELAY_S)
    if waiting:
        raise SpareStoreGone(
            f"the store at {address} went away ({last_error or 'no answer'}) without saying the job ended, while "
            "this node waited as a spare of the running job (its round was full or closed): this node had no "
            "part in the job and cannot tell how it ended"
        ) from last_error
    if refused:
        why = (
            "it accepted every connection and closed it at once: it does not admit this host "
            "(a store restricted to a running job's members, see docs/store-security.md)"
        )
        waited = refused_timeout if refused_timeout is not None else connect_timeout
    else:
        why = f"last error: {last_error or 'none'}"
        waited = connect_timeout
    raise StoreError(
        f"could not connect to the store at {address} within {_seconds(waited)} ({attempts} attempts; {why})"
    ) from last_error


def _seconds(value: float | None) -> str:
    return "forever" if value is None else f"{round(value, 1):g} s"


def _ask_as_spare(sock: socket.socket, address: str, deadline: Deadline) -> None:
    """``SPARE_HELLO``, and its answer: returns when admitted (the handshake goes on over
    ``sock``); raises :class:`_StillRunning`, :class:`JobEnded`, or :class:`ConnectionError` (a
    plain refusal: a store that does not answer it, or wants a secret this client lacks)."""
    bounded = Deadline(min(_SPARE_REPLY_S, deadline.remaining() or _SPARE_REPLY_S))
    sock.settimeout(bounded.remaining())
    sock.sendall(U8.pack(SPARE_HELLO))
    answer = recv_exact(sock, 1, bounded)[0]
    if answer == SPARE_ADMITTED:
        return
    if answer == SPARE_RUNNING:
        raise _StillRunning
    if answer == SPARE_ENDED:
        raise JobEnded(f"the store at {address} says the job has ended")
    raise ConnectionError(f"the store at {address} does not admit this host without the shared secret")


def _handshake(sock: socket.socket, address: str, deadline: Deadline, secret: bytes | None,
               reader: bool = False) -> None:
    # What torch's client does: a validation message (no reply), then a ping whose nonce the
    # server must echo; the ping proves the server accepted us. A reader says so first.
    if reader:
        sock.settimeout(deadline.remaining())
        sock.sendall(U8.pack(READER_HELLO))
    if secret is not None:
        _authenticate(sock, address, deadline, secret)
    nonce = os.getpid() & 0xFFFFFFFF
    validate = U8.pack(QueryType.VALIDATE) + U32.pack(VALIDATION_MAGIC)
    msg = validate + U8.pack(QueryType.PING) + U32.pack(nonce)
    sock.settimeout(deadline.remaining())
    sock.sendall(msg)
    (echo,) = U32.unpack(recv_exact(sock, 4, deadline))
    if echo != nonce:
        raise StoreError(f"store at {address} answered the ping with {echo}, expected {nonce}")


def _authenticate(sock: socket.socket, address: str, deadline: Deadline, secret: bytes) -> None:
    """The challenge-response of :mod:`launcher.store.admission`, client side."""
    client_nonce = new_nonce()
    sock.settimeout(deadline.remaining())
    sock.sendall(U8.pack(AUTH_HELLO) + client_nonce)
    try:
        status = recv_exact(sock, 1, deadline)[0]
    except ConnectionError:
        raise _Refused(
            f"the store at {address} closed the connection (is this address admitted?)", final=False
        ) from None
    if status == 1:
        raise _Refused(f"the store at {address} has no secret configured, but this client was given one")
    if status != 0:
        raise StoreError(f"store at {address} answered the authentication with {status}")
    server_nonce = recv_exact(sock, NONCE_LEN, deadline)
    their_proof = recv_exact(sock, PROOF_LEN, deadline)
    if not proofs_match(their_proof, server_proof(secret, client_nonce, server_nonce)):
        raise _Refused(f"the store at {address} does not know our secret")
    sock.sendall(U8.pack(AUTH_PROOF) + client_proof(secret, server_nonce, client_nonce))
    try:
        ack = recv_exact(sock, 1, deadline)[0]
    except ConnectionError:
        raise _Refused(f"the store at {address} rejected our secret") from None
    if ack != 0:
        raise StoreError(f"store at {address} answered our proof with {ack}")
