"""The webhook sink's flags, declared: names, defaults, variables and help, nothing that reads them.

:mod:`launcher_webhook.plugin` registers :data:`FLAGS` (every launch with this plugin installed
loads this module, for ``--help`` and parsing); :mod:`launcher_webhook.settings` reads and checks
the values, imported only when one of the flags is used.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile each field's annotation
# string at import, which every launch with the plugin pays.

from typing import NamedTuple

from launcher.flags import Flag, FlagGroup

__all__ = ["FLAGS", "WebhookOptions"]


class WebhookOptions(NamedTuple):
    """What the webhook flags (or their variables) say; ``url`` is ``None`` when neither gives one."""

    url: "str | None" = None
    timeout: float = 5.0
    batch_size: int = 50
    max_queue: int = 1000
    retries: int = 3
    backoff: float = 0.5
    close_timeout: float = 4.0


FLAGS: FlagGroup[WebhookOptions] = FlagGroup(
    name="webhook",
    title="webhook event handler (launcher-webhook; --event-log-handler webhook)",
    # Imported only when a webhook flag (or its variable) is used; else the defaults, unread.
    read="launcher_webhook.settings:read_webhook",
    unset=WebhookOptions(),
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
