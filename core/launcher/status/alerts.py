"""``launcher alerts rules|dashboard``: the Prometheus alerting rules and the Grafana dashboard
shipped with launcher, for its ``--metrics-port`` (docs/alerts.md).

Both are package data (``launcher/status/prometheus/``), printed byte for byte: what a site loads
is what the tests check with ``promtool``. Nothing is imported but what prints them.
"""

from __future__ import annotations

import os
import sys

from launcher.errors import UsageError
from launcher.values import quote

__all__ = ["FILES", "USAGE", "alerts_command", "shipped_path"]

#: What each argument prints: its file in ``launcher/status/prometheus/``.
FILES = {"rules": "rules.yml", "dashboard": "dashboard.json"}
USAGE = "usage: launcher alerts rules|dashboard (the Prometheus alerting rules, or the Grafana dashboard)"


def shipped_path(what: str) -> str:
    """The path of the shipped file ``what`` (a key of :data:`FILES`) names."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "prometheus", FILES[what])


def alerts_command(argv: list[str]) -> int:
    """Print the file the one argument names; a bad argument is a :class:`UsageError` (exit 2)."""
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(argv) != 1 or argv[0] not in FILES:
        what = "an argument is needed" if not argv else (
            f"unknown argument {quote(argv[0])}" if argv[0] not in FILES else f"unknown argument {quote(argv[1])}")
        raise UsageError(f"launcher alerts: {what}; {USAGE}")
    with open(shipped_path(argv[0]), "rb") as handle:
        data = handle.read()
    sys.stdout.buffer.write(data)  # bytes: the file as shipped, whatever the locale's encoding
    sys.stdout.flush()
    return 0
