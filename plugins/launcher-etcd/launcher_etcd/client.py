"""One connection to an etcd cluster through its v3 HTTP gateway (``etcd3gw``).

What this module adds to ``etcd3gw``: fail-over between the members named in ``--rdzv-endpoint``
with a bound on each operation, user/password authentication with token renewal, TLS settings,
errors that say in one line what is wrong, and watches that end at a deadline (``etcd3gw``'s
watch threads cannot be given one).

Imported only when the etcd backend is used: it imports ``requests`` and ``etcd3gw``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

import requests
from etcd3gw import exceptions as etcd_exceptions
from etcd3gw.client import Etcd3Client
from launcher.store.api import StoreError

from launcher_etcd.settings import EtcdSettings

__all__ = [
    "EtcdAuthError",
    "EtcdClient",
    "EtcdError",
    "EtcdTLSError",
    "EtcdUnavailableError",
    "LeaseNotFoundError",
    "WatchOutcome",
    "b64",
    "unb64",
]

log = logging.getLogger("launcher.rendezvous.etcd")

# gRPC status codes etcd puts in its JSON errors.
_INVALID_ARGUMENT = 3
_NOT_FOUND = 5
_PERMISSION_DENIED = 7
_UNAVAILABLE = 14
_UNAUTHENTICATED = 16


#: How :meth:`EtcdClient.watch_puts` ended.
WatchOutcome = Literal["seen", "deadline", "again", "broken"]


class EtcdError(StoreError):
    """etcd answered with an error; the message says which member and why."""


class EtcdUnavailableError(EtcdError):
    """No member of the cluster answered within the operation's time bound."""


class EtcdAuthError(EtcdError):
    """Authentication is needed, failed, or the user lacks permission on the job's keys."""


class EtcdTLSError(EtcdError):
    """The TLS handshake failed (wrong CA, certificate or key)."""


class LeaseNotFoundError(EtcdError):
    """The lease named in a write has expired or was revoked."""


class _Transient(Exception):
    """A failure worth retrying on another member. ``sent``: the request may have been applied."""

    def __init__(self, reason: str, *, sent: bool) -> None:
        super().__init__(reason)
        self.sent = sent


class _TokenExpired(Exception):
    """etcd refused the auth token (expired, or the member restarted and forgot it)."""


def b64(data: bytes) -> str:
    """etcd's JSON gateway carries keys and values in base64."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    """Inverse of :func:`b64`."""
    return base64.b64decode(text)


def _reason(exc: BaseException) -> str:
    """The innermost useful words of a requests/urllib3 connection error."""
    text = str(exc)
    for marker in ("Connection refused", "Read timed out", "timed out", "Connection reset", "Name or service not known",
                   "Temporary failure in name resolution", "No route to host", "Connection aborted",
                   "RemoteDisconnected"):  # fmt: skip
        if marker in text:
            return marker
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _was_sent(exc: BaseException) -> bool:
    """Whether a failed request may have reached etcd (and so been applied).

    A refused or timed-out *connect* never sent anything; anything later (a reset, a read
    timeout, a server gone mid-answer) might have.
    """
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return False
    text = str(exc)
    return not ("NewConnectionError" in text or "Connection refused" in text or "Failed to resolve" in text)


def _error_body(detail: str | None) -> tuple[int | None, str]:
    """The gRPC code and message of an error answer from the gateway."""
    if not detail:
        return None, ""
    try:
        body = json.loads(detail)
    except ValueError:
        return None, detail.strip().splitlines()[0][:200] if detail.strip() else ""
    if not isinstance(body, dict):
        return None, str(body)[:200]
    message = str(body.get("message") or body.get("error") or "").removeprefix("etcdserver: ")
    code = body.get("code", body.get("grpc_code"))
    return (int(code) if isinstance(code, (int, str)) and str(code).isdigit() else None), message


class EtcdClient:
    """Requests to whichever member of the cluster answers, within a time bound.

    Thread-safe: the rendezvous thread, its heartbeat thread and the lease keeper share one.
    Members are tried in the order given, starting with the last one that answered; a member
    that refuses, resets or times out is left for the next, and after a full turn the client
    backs off (50 ms doubling to 1 s) until the operation's bound (``read_timeout``) passes.
    """

    def __init__(self, settings: EtcdSettings) -> None:
        self.settings = settings
        session = requests.Session()
        # etcd is reached directly: a proxy from the environment (http_proxy without a matching
        # no_proxy) would swallow or break the streaming watches.
        session.trust_env = False
        if settings.ca_cert:
            session.verify = settings.ca_cert
        if settings.client_cert and settings.client_key:
            session.cert = (settings.client_cert, settings.client_key)
        self._session = session
        timeout = (settings.connect_timeout, settings.read_timeout)
        self._members = [
            Etcd3Client(
                host=endpoint.host,
                port=endpoint.port,
                protocol=settings.protocol,
                # requests takes (connect, read); etcd3gw passes it through unchanged.
                timeout=cast(Any, timeout),
                session=session,
            )
            for endpoint in settings.endpoints
        ]
        self._names = [str(endpoint) for endpoint in settings.endpoints]
        self._current = 0
        self._lock = threading.Lock()
        self._auth_lock = threading.Lock()
        self._token_generation = 0
        self._closed = False
        self._streams: set[requests.Response] = set()

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def endpoints(self) -> str:
        """The members, comma-separated, for messages."""
        return ", ".join(self._names)

    def _pick(self) -> tuple[int, Etcd3Client]:
        with self._lock:
            return self._current, self._members[self._current]

    def _advance(self, failed: int) -> None:
        with self._lock:
            if self._current == failed:
                self._current = (failed + 1) % len(self._members)

    def _post(self, index: int, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        member = self._members[index]
        name = self._names[index]
        try:
            url = member.get_url(path)  # the first call asks the member for its API version
            return cast(dict[str, Any], member.post(url, json=payload))
        except (etcd_exceptions.ConnectionFailedError, etcd_exceptions.ConnectionTimeoutError) as exc:
            cause = exc.__context__ or exc
            if isinstance(cause, requests.exceptions.SSLError):
                raise EtcdTLSError(
                    f"TLS with etcd at {name} failed: {_ssl_reason(cause)}; check cacert, cert and key "
                    "(--rdzv-conf) against etcd's --trusted-ca-file, --cert-file and --client-cert-auth"
                ) from None
            if isinstance(cause, requests.RequestException):
                raise _Transient(f"{name}: {_reason(cause)}", sent=_was_sent(cause)) from None
            # A 503 from the gateway: the member is up but has no leader (quorum lost, election).
            code, message = _error_body(exc.detail_text)
            raise _Transient(f"{name}: {message or 'unavailable'}", sent=True) from None
        except etcd_exceptions.ApiVersionDiscoveryFailedError as exc:
            raise EtcdError(
                f"{name} does not look like an etcd client port: {exc.detail_text or exc}; "
                "check --rdzv-endpoint (etcd's --advertise-client-urls)"
            ) from None
        except etcd_exceptions.Etcd3Exception as exc:
            code, message = _error_body(exc.detail_text)
            raise self._classify(name, path, code, message or str(exc.args[0] if exc.args else exc)) from None
        except requests.RequestException as exc:  # raised outside etcd3gw's own mapping
            raise _Transient(f"{name}: {_reason(exc)}", sent=_was_sent(exc)) from None
        except ValueError as exc:  # an answer that is not JSON: not an etcd gateway
            raise EtcdError(f"{name} answered {path} with something that is not etcd's JSON: {exc}") from None

    def _classify(self, name: str, path: str, code: int | None, message: str) -> Exception:
        lowered = message.lower()
        if code == _UNAUTHENTICATED or "invalid auth token" in lowered or "auth token is expired" in lowered:
            return _TokenExpired(message)
        if "user name is empty" in lowered:
            return EtcdAuthError(
                f"etcd at {name} requires authentication: give --rdzv-conf username=...,password=... "
                "(or set LAUNCHER_ETCD_USERNAME and LAUNCHER_ETCD_PASSWORD)"
            )
        if "authentication failed" in lowered or "invalid user id or password" in lowered:
            return EtcdAuthError(
                f"etcd at {name} rejected the credentials of user {self.settings.username!r}: {message}"
            )
        if code == _PERMISSION_DENIED or "permission denied" in lowered:
            return EtcdAuthError(
                f"etcd at {name} denied user {self.settings.username!r} access to {self.settings.prefix}: "
                f"{message}; grant its role readwrite on that prefix (etcdctl role grant-permission "
                f"--prefix=true ROLE readwrite {self.settings.prefix})"
            )
        if code == _NOT_FOUND and "lease" in lowered:
            return LeaseNotFoundError(message)
        if code == _UNAVAILABLE or any(
            words in lowered for words in ("leader changed", "no leader", "timed out", "error reading from server")
        ):
            return _Transient(f"{name}: {message}", sent=True)
        if code == _INVALID_ARGUMENT and "too many operations" in lowered:
            return EtcdError(f"etcd at {name}: {message} (raise etcd's --max-txn-ops)")
        return EtcdError(f"etcd at {name} answered {path} with an error: {message}")

    def _authenticate(self, index: int, seen_generation: int) -> None:
        """Get a fresh token (once per expiry, whichever thread notices first)."""
        with self._auth_lock:
            if self._token_generation != seen_generation:
                return  # another thread renewed it meanwhile
            payload = {"name": self.settings.username, "password": self.settings.password}
            result = self._post(index, "/auth/authenticate", payload)
            token = result.get("token")
            if not token:
                raise EtcdAuthError(f"etcd at {self._names[index]} gave no auth token: is auth enabled there?")
            self._session.headers["Authorization"] = str(token)
            self._token_generation += 1

    # -- requests ----------------------------------------------------------------------------

    def request(
        self,
        path: str,
        payload: dict[str, Any],
        *,
        timeout: float | None = None,
        if_applied: Callable[[], dict[str, Any] | None] | None = None,
    ) -> dict[str, Any]:
        """POST ``payload`` to ``/v3/<path>`` of a member that answers; its JSON answer.

        ``if_applied`` makes a write exactly-once across fail-over: after a failure that may
        have reached etcd it is called before any retry, and an answer it returns (the write
        took effect) is returned instead of writing again.

        Raises :class:`EtcdUnavailableError` when no member answers within ``timeout``
        (``read_timeout`` by default), or another :class:`EtcdError` for an error answer.
        """
        bound = self.settings.read_timeout if timeout is None else timeout
        deadline = time.monotonic() + bound
        failures = 0
        delay = 0.05
        maybe_applied = False
        last = ""
        while True:
            if self._closed:
                raise EtcdError("the etcd client is closed")
            if maybe_applied and if_applied is not None:
                found = if_applied()
                if found is not None:
                    return found
                maybe_applied = False
            index, _ = self._pick()
            generation = self._token_generation
            try:
                if self.settings.username and generation == 0:
                    self._authenticate(index, generation)
                return self._post(index, path, payload)
            except _TokenExpired:
                log.info("etcd auth token refused by %s; authenticating again", self._names[index])
                self._authenticate(index, generation)
                continue
            except _Transient as exc:
                maybe_applied = maybe_applied or exc.sent
                last = str(exc)
                self._advance(index)
                failures += 1
                if failures == 1 or failures % (4 * len(self._members)) == 0:
                    log.info("etcd request %s failed (%s); trying %s", path, last, self._names[self._current])
            now = time.monotonic()
            if now >= deadline:
                raise EtcdUnavailableError(
                    f"no etcd member answered within {bound:g} s (read_timeout); tried {self.endpoints}; "
                    f"last error: {last}"
                )
            if failures % len(self._members) == 0:  # a full turn failed: let the cluster recover
                time.sleep(min(delay, max(0.0, deadline - now)))
                delay = min(delay * 2, 1.0)

    def txn(
        self,
        compare: Sequence[dict[str, Any]] = (),
        success: Sequence[dict[str, Any]] = (),
        failure: Sequence[dict[str, Any]] = (),
        *,
        if_applied: Callable[[], dict[str, Any] | None] | None = None,
    ) -> dict[str, Any]:
        """One etcd transaction (``/kv/txn``)."""
        payload = {"compare": list(compare), "success": list(success), "failure": list(failure)}
        return self.request("/kv/txn", payload, if_applied=if_applied)

    def range(self, key: bytes, **options: Any) -> dict[str, Any]:
        """``/kv/range`` for one key (options: ``revision``, ``count_only``, ...)."""
        return self.request("/kv/range", {"key": b64(key), **options})

    # -- leases ------------------------------------------------------------------------------

    def grant_lease(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; its id."""
        result = self.request("/lease/grant", {"TTL": ttl, "ID": 0})
        if result.get("error"):
            raise EtcdError(f"etcd refused a lease: {result['error']}")
        return int(result["ID"])

    def keep_alive(self, lease_id: int) -> int:
        """Renew the lease; its new TTL, or -1 when it has expired already."""
        result = self.request("/lease/keepalive", {"ID": lease_id})
        body = result.get("result", result)
        return int(body.get("TTL", -1))

    def revoke_lease(self, lease_id: int) -> None:
        """Delete the lease and every key attached to it."""
        with contextlib.suppress(LeaseNotFoundError):
            self.request("/kv/lease/revoke", {"ID": lease_id})

    # -- watches -----------------------------------------------------------------------------

    def watch_puts(self, keys: Sequence[bytes], start_revision: int, deadline: float) -> WatchOutcome:
        """Block until every key in ``keys`` has been written at ``start_revision`` or later.

        Returns ``"seen"`` then; ``"deadline"`` when ``deadline`` passed first; ``"again"`` when
        the watch must be opened anew at once (the auth token was renewed); ``"broken"`` when
        it could not start or broke (the member went away, the revision was compacted), and the
        caller should back off a little. After anything but ``"seen"`` the caller reads the
        keys again and watches from that read's revision, so no write in between is missed.
        """
        wanted = set(keys)
        if not wanted:
            return "seen"
        low, high = min(wanted), max(wanted)
        create: dict[str, Any] = {"key": b64(low), "start_revision": str(start_revision), "filters": ["NODELETE"]}
        if high != low:
            create["range_end"] = b64(high + b"\0")
        left = deadline - time.monotonic()
        if left <= 0:
            return "deadline"
        index, member = self._pick()
        generation = self._token_generation
        try:
            url = member.get_url("/watch")
            # The read timeout bounds each wait for the next message: nothing comes while the
            # keys are missing, so it is what ends the watch at the deadline.
            response = self._session.post(
                url,
                json={"create_request": create},
                stream=True,
                timeout=(self.settings.connect_timeout, max(left, 0.05)),
            )
        except requests.exceptions.SSLError as exc:
            raise EtcdTLSError(f"TLS with etcd at {self._names[index]} failed: {_ssl_reason(exc)}") from None
        except (requests.RequestException, etcd_exceptions.Etcd3Exception) as exc:
            log.debug("etcd watch on %s failed to start: %s", self._names[index], exc)
            self._advance(index)
            return "broken"
        with self._lock:
            self._streams.add(response)
        try:
            if response.status_code != 200:
                code, message = _error_body(response.text)
                error = self._classify(self._names[index], "/watch", code or response.status_code, message)
                if isinstance(error, _TokenExpired):
                    self._authenticate(index, generation)
                    return "again"
                if isinstance(error, _Transient):
                    self._advance(index)
                    return "broken"
                raise error
            for line in response.iter_lines():
                if not line:
                    continue
                message_ = json.loads(line)
                result = message_.get("result") or {}
                if message_.get("error"):
                    # The member lost its own gRPC connection mid-stream (it is stopping): only
                    # an auth refusal is final; anything else means read again, maybe elsewhere.
                    code, text = _error_body(json.dumps(message_["error"]))
                    error = self._classify(self._names[index], "/watch", code, text)
                    if isinstance(error, EtcdAuthError):
                        raise error
                    if isinstance(error, _TokenExpired):
                        self._authenticate(index, generation)
                        return "again"
                    self._advance(index)
                    return "broken"
                if result.get("canceled"):
                    reason = str(result.get("cancel_reason") or "")
                    if "permission denied" in reason.lower():
                        raise self._classify(self._names[index], "/watch", _PERMISSION_DENIED, reason)
                    return "broken"  # compacted, or the member is stepping down: read again
                for event in result.get("events") or ():
                    if event.get("type", "PUT") == "PUT":
                        wanted.discard(unb64(event["kv"]["key"]))
                if not wanted:
                    return "seen"
                if time.monotonic() >= deadline:
                    return "deadline"
            return "broken"  # the member ended the stream
        except requests.RequestException:
            # A read timeout is the deadline passing; anything earlier is the member going away.
            if time.monotonic() < deadline - 0.01:
                self._advance(index)
                return "broken"
            return "deadline"
        except (ValueError, KeyError) as exc:
            log.debug("etcd watch on %s: unreadable message: %s", self._names[index], exc)
            return "broken"
        finally:
            with self._lock:
                self._streams.discard(response)
            response.close()

    # -- the end -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection, open watches included. Idempotent."""
        self._closed = True
        with self._lock:
            streams, self._streams = list(self._streams), set()
        for response in streams:
            with contextlib.suppress(Exception):  # closing must not raise
                response.close()
        self._session.close()


def _ssl_reason(exc: BaseException) -> str:
    """``certificate verify failed: unable to get local issuer certificate`` out of OpenSSL's text."""
    text = str(exc)
    found = re.search(r"\[SSL: ([A-Z0-9_]+)\] ([^(]+?)\s*\(_ssl", text)
    if found:
        return found.group(2)
    return text.splitlines()[0][:200] if text else type(exc).__name__
