"""The plugin module the ``launcher`` entry point names: registers ``mounts`` and ``shm``.

Cheap to import (listing plugins imports it): the checks' module loads only when a check has
something to check. Both are default checks (they run without ``--health-checks``) and skip
themselves until their variable is set, here, before :mod:`launcher_nodecheck.checks` is imported:
installing the distribution costs a launch nothing until a site configures it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import HealthCheck

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.health.api import CheckContext, CheckResult


#: The variables that configure the checks (read from the workers' environment).
MOUNTS_ENV = "LAUNCHER_NODECHECK_MOUNTS"
MIN_SHM_ENV = "LAUNCHER_NODECHECK_MIN_SHM_GIB"


def _unset(context: CheckContext, variable: str) -> CheckResult | None:
    """The skipped answer when ``variable`` is not set (nothing configured), else ``None``."""
    if context.env.get(variable, "").strip():
        return None
    from launcher.health.api import skipped

    return skipped(f"{variable} is not set")


def _mounts(context: CheckContext) -> CheckResult:
    unset = _unset(context, MOUNTS_ENV)
    if unset is not None:
        return unset
    from launcher_nodecheck.checks import check_mounts

    return check_mounts(context)


def _shm(context: CheckContext) -> CheckResult:
    unset = _unset(context, MIN_SHM_ENV)
    if unset is not None:
        return unset
    from launcher_nodecheck.checks import check_shm

    return check_shm(context)


@hookimpl
def launcher_health_checks() -> Iterator[HealthCheck]:
    """Register ``mounts`` and ``shm``."""
    yield HealthCheck(name="mounts", check=_mounts, time_limit=10.0,
                      description="Every mount point in $LAUNCHER_NODECHECK_MOUNTS is mounted")
    yield HealthCheck(name="shm", check=_shm, time_limit=5.0,
                      description="/dev/shm holds at least $LAUNCHER_NODECHECK_MIN_SHM_GIB GiB")
