"""The health-check settings: ``--health-checks`` and ``--health-check-cmd``, validated.

Names are checked against the registered checks when the plan is built
(:func:`resolve_health_checks`), so an unknown name is one line with a suggestion, exit status 2,
before anything starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.errors import UsageError
from launcher.values import quote

if TYPE_CHECKING:  # pragma: no cover
    from launcher.config import LaunchConfig
    from launcher.plugins.manager import LauncherPluginManager
    from launcher.plugins.types import HealthCheck

__all__ = [
    "HealthSettings",
    "check_health_config",
    "parse_health_check_cmd",
    "parse_health_checks",
    "resolve_health_checks",
    "settings_of",
]

#: The name of the check ``--health-check-cmd`` configures.
COMMAND_CHECK = "command"


@dataclass(frozen=True)
class HealthSettings:
    """``names``: the checks asked for (``None``: every default check, ``()``: none);
    ``command``: the ``--health-check-cmd`` path, absolute (``None`` when unset)."""

    names: tuple[str, ...] | None = None
    command: str | None = None


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


def check_health_config(config: LaunchConfig) -> None:
    """Normalise and check ``config.health_checks`` (to ``None`` or a tuple of names) and
    ``config.health_check_cmd`` (to an absolute path or ``None``), for the command line and the
    Python API alike."""
    value = config.health_checks
    if isinstance(value, (list, tuple)):
        items = [str(item) for item in value]
        value = ",".join(items) if items else "none"
    if value is not None and not isinstance(value, str):
        raise UsageError(f"LaunchConfig.health_checks must be names or 'none', got {type(value).__name__}")
    config.health_checks = parse_health_checks(value, "--health-checks")
    config.health_check_cmd = parse_health_check_cmd(config.health_check_cmd)


def settings_of(config: LaunchConfig) -> HealthSettings:
    """The settings ``config`` holds (after :func:`check_health_config`)."""
    names = config.health_checks
    return HealthSettings(tuple(names) if names is not None else None, config.health_check_cmd)


def resolve_health_checks(settings: HealthSettings, manager: LauncherPluginManager) -> tuple[HealthCheck, ...]:
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
