"""The webhook sink's flags: ``--webhook-url`` and its batch and retry settings, one flag group.

Declared, parsed and checked here (:data:`FLAGS`, registered by :mod:`launcher_webhook.plugin`),
so ``launcher --help`` lists them and a bad value stops the launch with one line before anything
starts. Each flag falls back on its ``LAUNCHER_WEBHOOK_*`` variable, as the settings always did.
The token stays an environment variable only: a command line is visible to every user of the
machine (``ps``). Light to import: every launch with this plugin installed reads these flags.
"""

from __future__ import annotations

from typing import NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import MAX_SECONDS, parse_int, parse_seconds

__all__ = ["FLAGS", "WebhookOptions", "check_url", "read_webhook", "redact"]

#: Upper bound of the counts: far above any real need, low enough to catch a typo.
MAX_COUNT = 1_000_000


class WebhookOptions(NamedTuple):
    """What the webhook flags (or their variables) say; ``url`` is ``None`` when neither gives one."""

    url: str | None = None
    timeout: float = 5.0
    batch_size: int = 50
    max_queue: int = 1000
    retries: int = 3
    backoff: float = 0.5
    close_timeout: float = 4.0


def redact(url: str) -> str:
    """``url`` without credentials, query or fragment: what logs and messages may show."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid URL>"
    return urllib.parse.urlunsplit((parts.scheme, host + port, parts.path, "", ""))


def check_url(url: str, name: str) -> str:
    """``url`` if it is an ``http://`` or ``https://`` URL with a host; a one-line UsageError otherwise."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{name} must be an http:// or https:// URL, got {redact(url)!r}")
    return url


def read_webhook(values: FlagValues) -> WebhookOptions:
    """The webhook flags, checked: numbers in range, the URL an http(s) URL."""
    url = values["webhook_url"]
    url = url.strip() if url is not None and url.strip() else None

    defaults = WebhookOptions._field_defaults  # an unset or empty value means the default

    def seconds(field: str, *, zero: bool = True) -> float:
        dest = f"webhook_{field}"
        return parse_seconds(values[dest] or defaults[field], values.source(dest), MAX_SECONDS, zero=zero)

    def count(field: str, low: int) -> int:
        dest = f"webhook_{field}"
        return parse_int(values[dest] or str(defaults[field]), values.source(dest), low, MAX_COUNT)

    return WebhookOptions(
        url=None if url is None else check_url(url, values.source("webhook_url")),
        timeout=seconds("timeout", zero=False),
        batch_size=count("batch_size", 1),
        max_queue=count("max_queue", 1),
        retries=count("retries", 0),
        backoff=seconds("backoff"),
        close_timeout=seconds("close_timeout"),
    )


FLAGS: FlagGroup[WebhookOptions] = FlagGroup(
    name="webhook",
    title="webhook event handler (launcher-webhook; --event-log-handler webhook)",
    read=read_webhook,
    flags=(
        Flag("--webhook-url", env="LAUNCHER_WEBHOOK_URL", underscore=False,
             help="http:// or https:// URL that receives the events (LAUNCHER_WEBHOOK_URL)."),
        Flag("--webhook-batch-size", env="LAUNCHER_WEBHOOK_BATCH_SIZE", underscore=False,
             help="Most events in one request (default 50; LAUNCHER_WEBHOOK_BATCH_SIZE)."),
        Flag("--webhook-max-queue", env="LAUNCHER_WEBHOOK_MAX_QUEUE", underscore=False,
             help="Most events waiting to be sent; beyond it the oldest are dropped (default 1000)."),
        Flag("--webhook-timeout", env="LAUNCHER_WEBHOOK_TIMEOUT", underscore=False,
             help="Seconds one request may take (default 5)."),
        Flag("--webhook-retries", env="LAUNCHER_WEBHOOK_RETRIES", underscore=False,
             help="Further attempts after a failed request (default 3)."),
        Flag("--webhook-backoff", env="LAUNCHER_WEBHOOK_BACKOFF", underscore=False,
             help="Seconds before the first retry, doubled with each further one (default 0.5)."),
        Flag("--webhook-close-timeout", env="LAUNCHER_WEBHOOK_CLOSE_TIMEOUT", underscore=False,
             help="Seconds spent at the end of the job sending what is still queued (default 4)."),
    ),
)
