"""The webhook sink: batches of events POSTed as JSON, never at the job's expense.

``emit`` only appends to a bounded queue; a sender thread of the sink's own takes up to
``batch_size`` events at a time and POSTs them, so events that arrive while a request is in
flight travel together in the next one. Each request has a timeout; a failed one (no connection,
timeout, HTTP 408/425/429 or 5xx) is retried a bounded number of times with exponential backoff
and jitter, honouring a ``Retry-After`` header; other answers (400, 401, 404, ...) are not
retried, since sending the same request again would not change them. A batch that still fails
is dropped and counted. When the queue is full the oldest event is dropped for the newest.
``close`` sends what is queued within ``close_timeout`` seconds.

Each request body::

    {"source": "launcher", "schema_version": 1, "batch_id": "5f0c...", "sent_at": 1700000000.5,
     "run_id": "job-42", "node": "host-a", "role": "trainer", "events": [<event>, ...]}

where each event is :meth:`launcher.events.model.Event.to_dict`. ``batch_id`` stays the same
across retries of one batch, so a receiver can drop a batch it already has (a retry after a
timeout may deliver it twice).

Standard library only (``urllib``): no HTTP package to install on every node, and ``urllib``
already honours ``https_proxy``/``no_proxy`` and the system's CA certificates.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from typing import Any

from launcher.errors import UsageError
from launcher.events.model import Event, EventSinkError, SinkContext

from launcher_webhook import __version__
from launcher_webhook.settings import WebhookOptions, check_url, redact

log = logging.getLogger("launcher.events.webhook")

#: Version of the request body's layout.
BODY_SCHEMA_VERSION = 1
#: No wait between retries is longer than this, whatever the backoff or Retry-After say.
MAX_BACKOFF = 30.0
_RETRYABLE_STATUS = frozenset({408, 425, 429})

URL_SETTING = "LAUNCHER_WEBHOOK_URL"
TOKEN_SETTING = "LAUNCHER_WEBHOOK_TOKEN"
TIMEOUT_SETTING = "LAUNCHER_WEBHOOK_TIMEOUT"
BATCH_SIZE_SETTING = "LAUNCHER_WEBHOOK_BATCH_SIZE"
MAX_QUEUE_SETTING = "LAUNCHER_WEBHOOK_MAX_QUEUE"
RETRIES_SETTING = "LAUNCHER_WEBHOOK_RETRIES"
BACKOFF_SETTING = "LAUNCHER_WEBHOOK_BACKOFF"
CLOSE_TIMEOUT_SETTING = "LAUNCHER_WEBHOOK_CLOSE_TIMEOUT"


@dataclass(frozen=True)
class WebhookSettings:
    """The sink's settings; :meth:`from_context` reads them from ``LAUNCHER_WEBHOOK_*``."""

    url: str
    #: Seconds one request may take.
    timeout: float = 5.0
    #: Most events in one request.
    batch_size: int = 50
    #: Most events waiting to be sent; beyond it the oldest are dropped.
    max_queue: int = 1000
    #: Further attempts after a failed one.
    retries: int = 3
    #: Seconds before the first retry; doubles with each further one.
    backoff: float = 0.5
    #: Seconds ``close`` spends sending what is queued. Under launcher's agent, which gives its
    #: sinks 5 s in all to close, the default leaves time for the final summary to be logged.
    close_timeout: float = 4.0
    #: Sent as ``Authorization: Bearer <token>`` when set; never logged.
    token: str | None = None

    def __post_init__(self) -> None:
        try:
            check_url(self.url, URL_SETTING)  # the flag group's check, named after the variable here
        except UsageError as exc:
            raise EventSinkError(str(exc)) from None

    @classmethod
    def from_context(cls, context: SinkContext) -> WebhookSettings:
        """The settings: the webhook flags' (checked by the command line), else ``LAUNCHER_WEBHOOK_*``.

        A sink created without the command line (the Python API, a bus built by hand) reads the
        variables here; :class:`EventSinkError` names the variable when one is wrong.
        """
        options = context.settings.get("webhook")
        if isinstance(options, WebhookOptions):
            return cls.from_options(options, context)
        url = context.setting(URL_SETTING)
        if url is None:
            raise EventSinkError(
                f"event handler 'webhook' needs {URL_SETTING}: the URL that receives the events, "
                f"e.g. {URL_SETTING}=https://monitoring.example.com/launcher-events"
            )
        return cls(
            url=url.strip(),
            timeout=context.float_setting(TIMEOUT_SETTING, cls.timeout, minimum=0.001),
            batch_size=context.int_setting(BATCH_SIZE_SETTING, cls.batch_size, minimum=1),
            max_queue=context.int_setting(MAX_QUEUE_SETTING, cls.max_queue, minimum=1),
            retries=context.int_setting(RETRIES_SETTING, cls.retries, minimum=0),
            backoff=context.float_setting(BACKOFF_SETTING, cls.backoff, minimum=0.0),
            close_timeout=context.float_setting(CLOSE_TIMEOUT_SETTING, cls.close_timeout, minimum=0.0),
            token=context.setting(TOKEN_SETTING),
        )

    @classmethod
    def from_options(cls, options: WebhookOptions, context: SinkContext) -> WebhookSettings:
        """The settings the webhook flag group read; the token from ``LAUNCHER_WEBHOOK_TOKEN``."""
        if options.url is None:
            raise EventSinkError(
                f"event handler 'webhook' needs --webhook-url or {URL_SETTING}: the URL that receives the "
                f"events, e.g. --webhook-url https://monitoring.example.com/launcher-events"
            )
        return cls(url=options.url, timeout=options.timeout, batch_size=options.batch_size,
                   max_queue=options.max_queue, retries=options.retries, backoff=options.backoff,
                   close_timeout=options.close_timeout, token=context.setting(TOKEN_SETTING))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib turns a redirected POST into a GET without a body, which would "succeed" without
    # delivering anything; a redirect is reported as the HTTP error it then is.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass(frozen=True)
class _Outcome:
    ok: bool
    retryable: bool
    detail: str
    retry_after: float | None = None


@dataclass(frozen=True)
class WebhookStats:
    """Counts since the sink started."""

    sent_events: int
    sent_batches: int
    failed_events: int
    dropped_events: int
    retries: int
    pending: int


class WebhookSink:
    """An event sink that POSTs batches of events to ``settings.url`` (see the module docstring)."""

    def __init__(self, settings: WebhookSettings, context: SinkContext) -> None:
        self.settings = settings
        self.context = context
        self._opener = urllib.request.build_opener(_NoRedirect())
        self._queue: deque[Event] = deque()
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._deadline: float | None = None
        self._sent_events = 0
        self._sent_batches = 0
        self._failed_events = 0
        self._dropped_events = 0
        self._retries = 0
        self._failure_logged = False
        self._thread = threading.Thread(target=self._run, name="launcher-webhook-sender", daemon=True)
        self._thread.start()

    # -- the job's side: never blocks -------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Queue ``event`` for sending; drops the oldest queued event when the queue is full."""
        first_drop = False
        with self._cond:
            if self._closing.is_set():
                self._dropped_events += 1
                return
            if len(self._queue) >= self.settings.max_queue:
                self._queue.popleft()
                self._dropped_events += 1
                first_drop = self._dropped_events == 1
            self._queue.append(event)
            self._cond.notify()
        if first_drop:
            log.warning(
                "webhook %s is not keeping up: its queue of %d events is full and the oldest are "
                "being dropped (raise %s to keep more)",
                redact(self.settings.url),
                self.settings.max_queue,
                MAX_QUEUE_SETTING,
            )

    def close(self) -> None:
        """Send what is queued, waiting ``close_timeout`` seconds at most, then stop."""
        with self._cond:
            if self._closing.is_set():
                return
            self._deadline = time.monotonic() + self.settings.close_timeout
            self._closing.set()
            self._cond.notify()
        # The sender keeps to the deadline itself; the margin covers one request's setup.
        self._thread.join(self.settings.close_timeout + 1.0)
        with self._cond:
            left = len(self._queue)
            self._queue.clear()
        self._failed_events += left
        stats = self.stats()
        if stats.failed_events or stats.dropped_events:
            log.warning(
                "webhook %s: %d events delivered, %d not delivered, %d dropped for lack of queue room",
                redact(self.settings.url),
                stats.sent_events,
                stats.failed_events,
                stats.dropped_events,
            )

    def stats(self) -> WebhookStats:
        """What has been sent, failed and dropped so far."""
        with self._cond:
            pending = len(self._queue)
        return WebhookStats(
            self._sent_events,
            self._sent_batches,
            self._failed_events,
            self._dropped_events,
            self._retries,
            pending,
        )

    # -- the sender thread ------------------------------------------------------------------

    def _remaining(self) -> float | None:
        """Seconds left before the close deadline, or ``None`` before ``close``."""
        deadline = self._deadline
        return None if deadline is None else deadline - time.monotonic()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing.is_set():
                    self._cond.wait()
                remaining = self._remaining()
                if not self._queue or (remaining is not None and remaining <= 0):
                    return
                batch = [
                    self._queue.popleft() for _ in range(min(len(self._queue), self.settings.batch_size))
                ]
            try:
                self._deliver(batch)
            except Exception as exc:  # a bug here must not stop the sender for good
                self._failed_events += len(batch)
                self._log_failure(len(batch), f"{type(exc).__name__}: {exc}")

    def _deliver(self, batch: list[Event]) -> None:
        batch_id = uuid.uuid4().hex
        body = self._body(batch, batch_id)
        attempt = 0
        while True:
            remaining = self._remaining()
            timeout = self.settings.timeout if remaining is None else min(self.settings.timeout, remaining)
            outcome = (
                self._post(body, batch_id, timeout)
                if timeout > 0
                else _Outcome(False, False, "no time left at close")
            )
            if outcome.ok:
                self._sent_events += len(batch)
                self._sent_batches += 1
                return
            if not outcome.retryable or attempt >= self.settings.retries:
                self._failed_events += len(batch)
                tries = f" after {attempt + 1} attempts" if attempt else ""
                self._log_failure(len(batch), outcome.detail + tries)
                return
            delay = self.settings.backoff * (2**attempt) * random.uniform(0.5, 1.0)
            if outcome.retry_after is not None:
                delay = outcome.retry_after
            self._pause(min(delay, MAX_BACKOFF))
            attempt += 1
            self._retries += 1

    def _pause(self, delay: float) -> None:
        if not self._closing.is_set():
            # Woken early by close(): the retry then runs at once, within the close deadline.
            self._closing.wait(delay)
            return
        remaining = self._remaining() or 0.0
        time.sleep(max(0.0, min(delay, remaining)))

    def _body(self, batch: list[Event], batch_id: str) -> bytes:
        payload = {
            "source": "launcher",
            "schema_version": BODY_SCHEMA_VERSION,
            "batch_id": batch_id,
            "sent_at": time.time(),
            "run_id": self.context.run_id,
            "node": self.context.node,
            "role": self.context.role,
            "events": [event.to_dict() for event in batch],
        }
        return json.dumps(payload, separators=(",", ":"), default=str).encode("utf-8")

    def _post(self, body: bytes, batch_id: str, timeout: float) -> _Outcome:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"launcher-webhook/{__version__}",
            "X-Launcher-Batch-Id": batch_id,
        }
        if self.settings.token:
            headers["Authorization"] = f"Bearer {self.settings.token}"
        request = urllib.request.Request(self.settings.url, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=timeout) as response:
                response.read(65536)  # drain a little so the connection closes cleanly
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
            retry_after = _retry_after(exc.headers)
            exc.close()
            retryable = status in _RETRYABLE_STATUS or status >= 500
            return _Outcome(False, retryable, f"HTTP {status} {exc.reason}", retry_after)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            # No connection, DNS failure, timeout, connection reset, malformed response.
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            return _Outcome(False, True, f"{type(reason).__name__}: {reason}")
        if 200 <= status < 300:
            return _Outcome(True, False, f"HTTP {status}")
        return _Outcome(False, False, f"HTTP {status}")

    def _log_failure(self, count: int, detail: str) -> None:
        if self._failure_logged:
            return
        self._failure_logged = True
        log.warning(
            "webhook %s could not take %d events (%s); the job goes on, further failures are "
            "counted and summarised at close",
            redact(self.settings.url),
            count,
            detail,
        )


def _retry_after(headers: Message | Mapping[str, str] | None) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:  # an HTTP date: rare for webhooks; fall back to our own backoff
        return None


def create_webhook_sink(context: SinkContext) -> WebhookSink:
    """Factory registered as the ``webhook`` event handler."""
    return WebhookSink(WebhookSettings.from_context(context), context)
