"""Private temporary directories: a unique name, mode 0700, made with system calls only.

Every launch creates its log directory before its first worker starts. :func:`tempfile.mkdtemp`
would do, but importing :mod:`tempfile` imports :mod:`shutil` and, through it, ``bz2``, ``lzma``
and ``fnmatch``: a few milliseconds on every launch's critical path (issue 16, start-up near the
floor), for one ``mkdir``. This module makes the same kind of directory, in the place
:func:`tempfile.gettempdir` would choose.
"""

from __future__ import annotations

import errno
import os

__all__ = ["make_private_dir", "temp_root"]

#: Names tried before giving up; a clash among 2**48 random names means something is wrong.
_ATTEMPTS = 100


def temp_root() -> str:
    """Where temporary directories go by default, searched in :func:`tempfile.gettempdir`'s order.

    ``$TMPDIR``, ``$TEMP``, ``$TMP``, then ``/tmp``, ``/var/tmp``, ``/usr/tmp``: the first that is
    a directory this process may create entries in; the working directory when none is.
    """
    candidates = [os.environ.get(name, "") for name in ("TMPDIR", "TEMP", "TMP")]
    for path in [*candidates, "/tmp", "/var/tmp", "/usr/tmp"]:
        if path and os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK):
            return os.path.abspath(path)
    return os.getcwd()


def make_private_dir(prefix: str, parent: str | None = None) -> str:
    """Create a new directory ``prefix`` + 12 random hex digits in ``parent`` (default:
    :func:`temp_root`), readable only by its owner (0700), and return its absolute path.

    Like :func:`tempfile.mkdtemp`, it never reuses an existing entry: ``mkdir`` fails on any, so
    nobody can slip a directory or a link of their own in its place.
    """
    parent = os.path.abspath(parent if parent is not None else temp_root())
    for _ in range(_ATTEMPTS):
        path = os.path.join(parent, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, f"no unused name for a new directory {prefix}* in {parent}")
