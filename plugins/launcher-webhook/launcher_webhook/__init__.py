"""launcher-webhook: send launcher's lifecycle events to an HTTP endpoint.

Install it beside launcher and choose it with ``--event-log-handler webhook``; settings come from
the ``--webhook-*`` flags or their ``LAUNCHER_WEBHOOK_*`` environment variables (see the README,
:mod:`launcher_webhook.settings` and :mod:`launcher_webhook.sink`).
"""

__version__ = "0.1.0"
