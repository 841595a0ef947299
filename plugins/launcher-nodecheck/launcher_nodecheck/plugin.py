"""The plugin module the ``launcher`` entry point names: registers ``mounts`` and ``shm``.

Cheap to import (listing plugins imports it): the checks' module loads only when a check runs.
Both are default checks (they run without ``--health-checks``) and skip themselves until their
variable is set, so installing the distribution changes nothing until a site configures it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import HealthCheck

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.health.api import CheckContext, CheckResult


def _mounts(context: CheckContext) -> CheckResult:
    from launcher_nodecheck.checks import check_mounts

    return check_mounts(context)


def _shm(context: CheckContext) -> CheckResult:
    from launcher_nodecheck.checks import check_shm

    return check_shm(context)


@hookimpl
def launcher_health_checks() -> Iterator[HealthCheck]:
    """Register ``mounts`` and ``shm``."""
    yield HealthCheck(name="mounts", check=_mounts, time_limit=10.0,
                      description="Every mount point in $LAUNCHER_NODECHECK_MOUNTS is mounted")
    yield HealthCheck(name="shm", check=_shm, time_limit=5.0,
                      description="/dev/shm holds at least $LAUNCHER_NODECHECK_MIN_SHM_GIB GiB")
