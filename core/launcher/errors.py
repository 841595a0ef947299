"""Exceptions that decide how the command line ends.

A :class:`UsageError` means the user asked for something invalid: the CLI prints its message on
one line and exits with status 2 before any worker starts. A :class:`LaunchError` happens at run
time; it carries the details needed to say which node, rank or process failed.
"""

from __future__ import annotations


class UsageError(Exception):
    """Invalid input: reported as one line, exit status 2, no traceback."""

    exit_code = 2


class LaunchError(Exception):
    """The job could not run to completion."""

    exit_code = 1
