"""Failure reports: what failed first, on which node and rank, and why.

* :func:`record` decorates a worker's main function so its exception reaches the report
  (stdlib only; same error-file format as torch's ``@record``).
* :class:`WorkerFailure` is what the agent observed of one failed worker;
  :class:`FailureReport` reads the error files, picks the root cause and renders it.
* :class:`OomWatch` says whether a ``SIGKILL`` was the kernel's out-of-memory killer.
* :func:`describe_exit`, :func:`signal_name`, :func:`explain_signal`: how a process ended, in
  words (:mod:`launcher.failures.exits`).

See ``docs/failures.md``.
"""

from typing import TYPE_CHECKING, Any

# Imported eagerly: ``record`` is what worker scripts use, and binding the function here keeps
# the name from resolving to the submodule of the same name.
from launcher.failures.record import ERROR_FILE_ENV, record

if TYPE_CHECKING:  # pragma: no cover
    from launcher.failures.errorfile import ErrorFileContent
    from launcher.failures.exits import describe_exit, explain_signal, signal_name
    from launcher.failures.oom import OomWatch
    from launcher.failures.report import (
        FailureReport,
        RankState,
        ReportedFailure,
        WorkerFailure,
    )

# Loaded on first use: a worker that only wants ``record`` should not pay for the report code.
_WHERE = {
    "OomWatch": "oom",
    "ErrorFileContent": "errorfile",
    "FailureReport": "report",
    "RankState": "report",
    "ReportedFailure": "report",
    "WorkerFailure": "report",
    "describe_exit": "exits",
    "explain_signal": "exits",
    "signal_name": "exits",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        module = importlib.import_module(f"launcher.failures.{_WHERE[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'launcher.failures' has no attribute {name!r}")


__all__ = [
    "ERROR_FILE_ENV",
    "ErrorFileContent",
    "FailureReport",
    "OomWatch",
    "RankState",
    "ReportedFailure",
    "WorkerFailure",
    "describe_exit",
    "explain_signal",
    "record",
    "signal_name",
]
