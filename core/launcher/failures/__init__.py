"""Failure reports: what failed first, on which node and rank, and why.

* :func:`record` decorates a worker's main function so its exception reaches the report
  (stdlib only; same error-file format as torch's ``@record``).
* :class:`WorkerFailure` is what the agent observed of one failed worker;
  :class:`FailureReport` reads the error files, picks the root cause and renders it.
* :class:`OomWatch` says whether a ``SIGKILL`` was the kernel's out-of-memory killer.

See ``docs/failures.md``.
"""

from launcher.failures.oom import OomWatch
from launcher.failures.record import ERROR_FILE_ENV, record
from launcher.failures.report import (
    ErrorFileContent,
    FailureReport,
    ReportedFailure,
    WorkerFailure,
    explain_signal,
    signal_name,
)

__all__ = [
    "ERROR_FILE_ENV",
    "ErrorFileContent",
    "FailureReport",
    "OomWatch",
    "ReportedFailure",
    "WorkerFailure",
    "explain_signal",
    "record",
    "signal_name",
]
