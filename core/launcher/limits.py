"""The machine's limits on processes and open files, checked before workers start.

A job that cannot fit under ``ulimit -n`` or ``ulimit -u`` would otherwise fail half-way through
starting its workers (EMFILE from ``pipe()``, EAGAIN from ``fork()``); checking up front turns that
into one line before anything starts. :func:`describe_spawn_error` words the same failure when it
still happens at spawn time (other processes of the user took the room meanwhile).
"""

from __future__ import annotations

import errno
import os

from launcher.errors import LaunchError, UsageError

#: Descriptors the agent holds at least, per worker: the read ends of its stdout and stderr pipes
#: and its pidfd (measured: 3 per worker without log files, 5 with --tee 3 and filters). The
#: check uses the minimum so that it never refuses a job that would run; the spawn-time message
#: covers the rest.
FDS_PER_WORKER = 3
#: Descriptors the agent needs besides its workers (measured: about 17).
FDS_RESERVED = 16

#: errno values that mean "the machine's limit", at pipe(), fork() or exec().
LIMIT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


class ResourceLimitError(LaunchError):
    """Workers could not start because a limit of the machine was reached."""


def check_worker_limits(nproc: int) -> None:
    """Raise :class:`UsageError` when ``nproc`` workers cannot fit under this process's limits."""
    import resource

    need = FDS_PER_WORKER * nproc + FDS_RESERVED
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and need > soft:
        raise UsageError(
            f"--nproc-per-node {nproc} needs at least {need} open files in the launcher, but the limit "
            f"(ulimit -n) is {soft}: raise it, or start fewer workers"
        )
    # RLIMIT_NPROC counts every process of the user and does not bind root; only a limit lower
    # than the workers alone is a sure failure.
    if os.geteuid() != 0:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY and nproc >= soft:
            raise UsageError(
                f"--nproc-per-node {nproc} workers exceed the limit on processes (ulimit -u) of {soft}: "
                "raise it, or start fewer workers"
            )


def describe_spawn_error(exc: OSError, nproc: int) -> str | None:
    """One line for an ``OSError`` raised while starting workers, when it is a machine limit."""
    if exc.errno not in LIMIT_ERRNOS:
        return None
    what = {
        errno.EMFILE: "too many open files in the launcher (ulimit -n)",
        errno.ENFILE: "too many open files on the machine (fs.file-max)",
        errno.EAGAIN: "too many processes for this user (ulimit -u) or the machine",
        errno.ENOMEM: "out of memory",
    }[exc.errno]
    code = errno.errorcode[exc.errno]
    return f"cannot start {nproc} workers: {what} [{code}]; raise the limit, or start fewer workers"
