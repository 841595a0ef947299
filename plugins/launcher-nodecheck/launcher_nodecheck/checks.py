"""The checks: required mount points, and the size of shared memory.

``LAUNCHER_NODECHECK_MOUNTS`` (comma list of absolute paths): each must be a mount point, and
readable; a network file system that hangs shows as the check's time limit, not a hung agent
(``os.path.ismount`` runs in the check's thread, which the runner abandons at its limit).
``LAUNCHER_NODECHECK_MIN_SHM_GIB``: ``/dev/shm`` must be at least that large (a container's
64 MiB default breaks PyTorch's DataLoader workers and NCCL's shared-memory transport). The
variables are read from the workers' environment (:attr:`CheckContext.env`), so a launch's own
setting wins over the node's.
"""

from __future__ import annotations

import os

from launcher.health.api import CheckContext, CheckResult, healthy, sick, skipped

from launcher_nodecheck.plugin import MIN_SHM_ENV, MOUNTS_ENV

__all__ = ["MIN_SHM_ENV", "MOUNTS_ENV", "SHM_PATH", "check_mounts", "check_shm"]
#: Where shared memory lives (``LAUNCHER_NODECHECK_SHM_PATH`` changes it, for tests).
SHM_PATH = "/dev/shm"


def check_mounts(context: CheckContext) -> CheckResult:
    """Sick when a path of :data:`MOUNTS_ENV` is not a mount point or cannot be listed."""
    text = context.env.get(MOUNTS_ENV, "").strip()
    if not text:
        return skipped(f"{MOUNTS_ENV} is not set")
    paths = [p.strip() for p in text.split(",") if p.strip()]
    for path in paths:
        if not os.path.isabs(path):
            return sick(f"{MOUNTS_ENV} names {path!r}: give absolute paths")
        if not os.path.ismount(path):
            missing = "does not exist" if not os.path.exists(path) else "is not mounted"
            return sick(f"required mount {path} {missing}")
        try:
            os.listdir(path)
        except OSError as exc:
            return sick(f"required mount {path} cannot be read: {exc.strerror or exc}")
    return healthy()


def check_shm(context: CheckContext) -> CheckResult:
    """Sick when shared memory is smaller than :data:`MIN_SHM_ENV` GiB."""
    text = context.env.get(MIN_SHM_ENV, "").strip()
    if not text:
        return skipped(f"{MIN_SHM_ENV} is not set")
    try:
        needed = float(text)
    except ValueError:
        return sick(f"{MIN_SHM_ENV}={text!r} is not a number of GiB")
    path = context.env.get("LAUNCHER_NODECHECK_SHM_PATH", SHM_PATH)
    try:
        stats = os.statvfs(path)
    except OSError as exc:
        return sick(f"shared memory {path} cannot be read: {exc.strerror or exc}")
    size = stats.f_blocks * stats.f_frsize / (1 << 30)
    if size < needed:
        return sick(f"{path} is {size:.2f} GiB, below the {needed:g} GiB needed ({MIN_SHM_ENV})")
    return healthy()
