"""The health-check flags, ``--health-checks`` and ``--health-check-cmd``: declared, parsed and checked here.

:data:`FLAGS` reads them into one :class:`HealthSettings` (``settings["health"]``); the Python API
builds the same object with :func:`health_settings`. Names are checked against the registered
checks when the plan is built (:func:`resolve_health_checks`), so an unknown name is one line with
a suggestion, exit status 2, before anything starts.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import quote

if TYPE_CHECKING:  # pragma: no cover
    from launcher.plugins.manager import LauncherPluginManager
    from launcher.plugins.types import HealthCheck

__all__ = [
    "FLAGS",
    "HealthSettings",
    "health_settings",
    "parse_health_check_cmd",
    "parse_health_checks",
    "read_health",
    "resolve_health_checks",
]

#: The name of the check ``--health-check-cmd`` configures.
COMMAND_CHECK = "command"


class HealthSettings(NamedTuple):
    """``names``: the checks asked for (``None``: every default check, ``()``: none);
    ``command``: the ``--health-check-cmd`` path, absolute (``None`` when unset)."""

    names: "tuple[str, ...] | None" = None
    command: "str | None" = None


def parse_health_checks(value: str | None, flag: str = "--health-checks") -> tuple[str, ...] | None:
    """``None`` for unset or empty (the default checks), ``()`` for ``none``, else the names (each
    once, lower case, in order). An empty item is refused: ``gpu,,disk`` is a typo, not a list."""
    if value is None or not value.strip():
        return None
    items = [item.strip().lower() for item in value.split(",")]
    if items == ["none"]:
        return ()
    if not all(items):
        raise UsageError(f"{flag} {quote(value)} has an empty name: give names like gpu,disk, or none")
    if "none" in items:
        raise UsageError(f"{flag} {quote(value)}: 'none' turns every check off and goes alone")
    return tuple(dict.fromkeys(items))


def parse_health_check_cmd(value: str | None, flag: str = "--health-check-cmd") -> str | None:
    """The command's absolute path, or ``None`` when unset. It must exist, be a file and be
    executable by this user: found now, not at the first round."""
    if value is None or not value.strip():
        return None
    path = os.path.abspath(os.path.expanduser(value.strip()))
    if not os.path.exists(path):
        raise UsageError(f"{flag} {quote(value)} does not exist: give the path of an executable file")
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {quote(value)} is not a file: give the path of an executable file")
    if not os.access(path, os.X_OK):
        raise UsageError(f"{flag} {quote(value)} is not executable: chmod +x it, or give an executable file")
    return path


def read_health(values: FlagValues) -> HealthSettings:
    """``--health-checks`` and ``--health-check-cmd``, checked."""
    return HealthSettings(parse_health_checks(values["health_checks"], values.source("health_checks")),
                          parse_health_check_cmd(values["health_check_cmd"], values.source("health_check_cmd")))


def health_settings(checks: "str | Sequence[str] | None" = None, command: "str | None" = None) -> HealthSettings:
    """The Python API's way to the same settings: ``LaunchConfig(settings={"health": health_settings("disk")})``.

    ``checks`` is a comma list or a sequence of names (``"none"`` or ``[]``: no check; ``None``: the
    default checks); checked as the flags are.
    """
    if isinstance(checks, (list, tuple)):
        checks = ",".join(str(item) for item in checks) if checks else "none"
    if checks is not None and not isinstance(checks, str):
        raise UsageError(f"health checks must be names or 'none', got {type(checks).__name__}")
    return HealthSettings(parse_health_checks(checks, "--health-checks"), parse_health_check_cmd(command))


def resolve_health_checks(settings: HealthSettings, manager: "LauncherPluginManager") -> "tuple[HealthCheck, ...]":
    """The registrations to run, each once (aliases collapsed); unknown names raise the
    manager's one-line error with a suggestion."""
    from launcher.plugins.types import HealthCheck

    if settings.names is None:
        chosen = [p.registration for p in manager.unique_registrations(HealthCheck) if p.registration.default]
    else:
        chosen = [manager.get(HealthCheck, name) for name in settings.names]
        if settings.command is not None and not any(c.name == COMMAND_CHECK for c in chosen):
            raise UsageError(
                f"--health-check-cmd is given but --health-checks {','.join(settings.names) or 'none'} leaves out "
                f"the {COMMAND_CHECK!r} check: add {COMMAND_CHECK} to the list, or drop --health-check-cmd"
            )
    unique: dict[str, HealthCheck] = {}
    for check in chosen:
        unique.setdefault(check.name, check)
    return tuple(unique.values())


FLAGS: FlagGroup[HealthSettings] = FlagGroup(
    name="health",
    title="health checks",
    read=read_health,
    flags=(
        Flag("--health-checks", default=None,
             help="Checks run before each round this node joins, comma list, or none (default: every built-in that "
             "applies: gpu, disk, python, command). A sick node stays out and exits with status 69."),
        Flag("--health-check-cmd", default=None,
             help="The site's health-check executable: exit 0 is healthy, else its first output line is the reason."),
    ),
)
