"""The ``cpu`` device provider: the CPUs this process may run on."""

from __future__ import annotations

import os


def count_cpus() -> int:
    """How many CPUs this process may run on.

    The process's affinity mask, not the host's CPU count: inside a container or a cgroup cpuset
    (Slurm, Kubernetes) the host may have 256 CPUs while this job may use 8, and starting 256
    workers on 8 CPUs is never what ``--nproc-per-node cpu`` means.
    """
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:  # absent on macOS and Windows
        return len(getaffinity(0))
    return os.cpu_count() or 1
