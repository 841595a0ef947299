"""Which containment ``LAUNCHER_CONTAINMENT`` asks for: read by the containment and by the cgroup warm-up.

A module of its own so that :mod:`launcher.containment.cgroups` (the warm-up, before any
containment exists) and :mod:`launcher.containment.containment` (which imports ``cgroups``) both
read it without importing each other.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("launcher.agent")

#: ``auto`` (the default): a cgroup where one is writable, else (command line) a child subreaper;
#: ``subreaper``: never a cgroup (how the tests force the fallback); ``off``: neither.
MODE_VARIABLE = "LAUNCHER_CONTAINMENT"
MODES = ("auto", "subreaper", "off")


def requested_mode() -> str:
    """The mode ``LAUNCHER_CONTAINMENT`` asks for (``auto`` when unset; warns and uses ``auto`` when invalid)."""
    value = os.environ.get(MODE_VARIABLE, "auto").strip().lower() or "auto"
    if value not in MODES:
        log.warning("%s=%s is not one of %s: using auto", MODE_VARIABLE, value, ", ".join(MODES))
        return "auto"
    return value
