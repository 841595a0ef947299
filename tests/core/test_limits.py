"""The machine's limits, checked before workers start: one line each (launcher.limits).

In-process, with the limits and the user faked: the real ``ulimit -u`` does not bind root, and
lowering it for a test would also limit everything else the test user runs.
"""

from __future__ import annotations

import errno
import resource

import pytest
from launcher import limits
from launcher.errors import UsageError


def _fake_limits(monkeypatch: pytest.MonkeyPatch, *, nproc: int, nofile: int = resource.RLIM_INFINITY,
                 euid: int = 1000) -> None:
    real = resource.getrlimit

    def getrlimit(which: int) -> tuple[int, int]:
        if which == resource.RLIMIT_NPROC:
            return nproc, nproc
        if which == resource.RLIMIT_NOFILE:
            return nofile, nofile
        return real(which)

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    monkeypatch.setattr(limits.os, "geteuid", lambda: euid)


def test_more_workers_than_the_process_limit_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_limits(monkeypatch, nproc=8)
    with pytest.raises(UsageError) as info:
        limits.check_worker_limits(8)
    message = str(info.value)
    assert message == (
        "--nproc-per-node 8 workers exceed the limit on processes (ulimit -u) of 8: raise it, or start fewer workers"
    )
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("nproc", "rlimit", "euid"),
    [(7, 8, 1000), (64, resource.RLIM_INFINITY, 1000), (64, 8, 0)],  # fits; no limit; root is not bound by it
)
def test_a_process_limit_that_does_not_bind_passes(monkeypatch: pytest.MonkeyPatch, nproc: int, rlimit: int,
                                                   euid: int) -> None:
    _fake_limits(monkeypatch, nproc=rlimit, euid=euid)
    limits.check_worker_limits(nproc)


def test_the_open_files_limit_is_checked_first(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_limits(monkeypatch, nproc=2, nofile=20)
    with pytest.raises(UsageError, match=r"^--nproc-per-node 4 needs at least 28 open files in the launcher, "
                                         r"but the limit \(ulimit -n\) is 20: raise it, or start fewer workers$"):
        limits.check_worker_limits(4)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (errno.EAGAIN, "cannot start 4 workers: too many processes for this user (ulimit -u) or the machine "
                       "[EAGAIN]; raise the limit, or start fewer workers"),
        (errno.EMFILE, "cannot start 4 workers: too many open files in the launcher (ulimit -n) [EMFILE]"),
        (errno.ENFILE, "too many open files on the machine (fs.file-max) [ENFILE]"),
        (errno.ENOMEM, "out of memory [ENOMEM]"),
    ],
)
def test_a_limit_hit_while_spawning_is_one_line(code: int, words: str) -> None:
    message = limits.describe_spawn_error(OSError(code, "whatever the C library says"), 4)
    assert message is not None and words in message
    assert "\n" not in message


def test_other_spawn_errors_are_not_called_limits() -> None:
    assert limits.describe_spawn_error(OSError(errno.ENOENT, "No such file or directory"), 4) is None
