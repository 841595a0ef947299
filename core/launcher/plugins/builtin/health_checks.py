"""Built-in health checks: ``gpu``, ``disk``, ``python``, ``command`` (see docs/health.md).

Registered exactly as a third party's would be; the checks live in :mod:`launcher.health` and
are imported only when a check runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import HealthCheck

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.health.api import CheckContext, CheckResult


def _gpu(context: CheckContext) -> CheckResult:
    from launcher.health.gpu import gpu_check

    return gpu_check()(context)


def _disk(context: CheckContext) -> CheckResult:
    from launcher.health.builtin import check_disk

    return check_disk(context)


def _python(context: CheckContext) -> CheckResult:
    from launcher.health.builtin import check_python

    return check_python(context)


def _command(context: CheckContext) -> CheckResult:
    from launcher.health.builtin import check_command

    return check_command(context)


@hookimpl
def launcher_health_checks() -> Iterator[HealthCheck]:
    yield HealthCheck(name="gpu", check=_gpu, time_limit=15.0,
                      description="NVIDIA GPUs through NVML: all expected visible, no ECC, retirement or bus fault")
    yield HealthCheck(name="disk", check=_disk, time_limit=5.0,
                      description="At least 1 GiB free under --log-dir and the temporary directory")
    yield HealthCheck(name="python", check=_python, time_limit=60.0,
                      description="The workers' interpreter starts and imports the -m package and --preload modules")
    yield HealthCheck(name="command", check=_command, time_limit=60.0,
                      description="--health-check-cmd exits 0 (else its first output line is the reason)")
