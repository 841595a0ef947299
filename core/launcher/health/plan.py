"""The health part of a launch plan: which checks run, on what (:class:`HealthPlan`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.health.api import CheckContext
from launcher.health.settings import HealthSettings, resolve_health_checks

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.group import Entrypoint
    from launcher.plugins.manager import LauncherPluginManager
    from launcher.plugins.types import DeviceProvider, HealthCheck

__all__ = ["HealthPlan", "build_health_plan", "temp_dir", "worker_python"]


@dataclass(frozen=True)
class HealthPlan:
    """The checks to run before each round this node joins, and the context they see."""

    checks: tuple[HealthCheck, ...]
    context: CheckContext


def worker_python(entry: Entrypoint) -> tuple[str | None, str | None, str | None]:
    """The workers' interpreter, ``-m`` module and script, as the entrypoint says (the
    interpreter is ``None`` for ``--no-python`` programs)."""
    command = entry.command
    if command is None:  # a function (the API, --run-path): workers are this interpreter
        return sys.executable, None, None
    if len(command) >= 3 and command[1] == "-u":  # the command line's form: python -u [-m] ...
        if command[2] == "-m" and len(command) >= 4:
            return command[0], command[3], None
        return command[0], None, command[2]
    return None, None, None


def temp_dir(env: Mapping[str, str]) -> str:
    """The workers' temporary directory, found as :func:`tempfile.gettempdir` looks for it (the
    ``tempfile`` module itself stays off the start path)."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        if env.get(name):
            return env[name]
    return "/tmp" if os.path.isdir("/tmp") else os.getcwd()


def build_health_plan(settings: HealthSettings, manager: LauncherPluginManager, *, node: str, entry: Entrypoint,
                      env: Mapping[str, str], log_dir: str | None, preload: tuple[str, ...], nproc_per_node: int,
                      device_provider: DeviceProvider | None) -> HealthPlan | None:
    """The plan, or ``None`` when no check is to run (``--health-checks none``)."""
    checks = resolve_health_checks(settings, manager)
    if not checks:
        return None
    if any(check.name == "disk" for check in checks):  # its threshold is read now: bad input is exit 2
        from launcher.health.builtin import min_free_bytes

        min_free_bytes(env)
    python, module, script = worker_python(entry)
    context = CheckContext(
        node=node, env=dict(env), log_dir=log_dir, temp_dir=temp_dir(env), python=python, module=module,
        script=script, preload=tuple(preload), nproc_per_node=nproc_per_node,
        device_kind=device_provider.name if device_provider is not None else None, command=settings.command,
    )
    return HealthPlan(checks, context)
