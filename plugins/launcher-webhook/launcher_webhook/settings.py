"""The webhook sink's flags read and checked: ``--webhook-url`` and its batch and retry settings.

The flags themselves are declared in :mod:`launcher_webhook.flags` (:data:`FLAGS`, registered by
:mod:`launcher_webhook.plugin`), which names this module's :func:`read_webhook` without importing
it: a launch that uses no webhook flag loads neither. A bad value stops the launch with one line
before anything starts. Each flag falls back on its ``LAUNCHER_WEBHOOK_*`` variable, as the
settings always did. The token stays an environment variable only: a command line is visible to
every user of the machine (``ps``).
"""

from __future__ import annotations

from launcher.errors import UsageError
from launcher.flags import FlagValues
from launcher.values import MAX_SECONDS, parse_int, parse_seconds

from launcher_webhook.flags import FLAGS, WebhookOptions

__all__ = ["FLAGS", "WebhookOptions", "check_url", "read_webhook", "redact"]

#: Upper bound of the counts: far above any real need, low enough to catch a typo.
MAX_COUNT = 1_000_000


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
