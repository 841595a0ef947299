"""The ``record`` decorator: a worker's uncaught exception, written where the launcher reads it.

The launcher gives every worker ``TORCHELASTIC_ERROR_FILE``. A main function decorated with
:func:`record` writes its uncaught exception there, in the same format as torch's
``torch.distributed.elastic.multiprocessing.errors.record`` (see
:mod:`launcher.failures.errorfile`), so reports (ours or torchrun's) show the worker's traceback
instead of only its exit code. Importing this module costs nothing beyond the standard library:
workers that do not use torch can use it too.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

if TYPE_CHECKING:  # pragma: no cover - loaded when an exception is written, not by every worker
    from launcher.failures.errorfile import ErrorFileContent

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"

P = ParamSpec("P")
R = TypeVar("R")


def error_file_content(
    exc: BaseException, callstack: str | None = None, when: float | None = None
) -> ErrorFileContent:
    """What :func:`record` writes for ``exc``.

    ``callstack`` defaults to the traceback of the exception being handled (call this inside an
    ``except`` block); ``when`` defaults to now.
    """
    from launcher.failures.errorfile import ErrorFileContent

    if callstack is None:
        callstack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ErrorFileContent(
        message=f"{type(exc).__name__}: {exc}",
        traceback=callstack,
        timestamp=time.time() if when is None else when,
    )


def write_error_file(path: str, exc: BaseException, callstack: str | None = None) -> bool:
    """Write ``exc`` to ``path`` in the error-file format; ``True`` when it was written.

    ``callstack`` is the traceback text to record (default: the exception's whole traceback).

    Never raises: a worker that is already failing must fail with its own exception, not with
    one about the error file. The file is written to a temporary name and renamed, so a reader
    never sees half a file even if the worker is killed while writing.
    """
    try:
        error_file_content(exc, callstack).write(path)
        return True
    except Exception as write_error:  # see docstring
        with contextlib.suppress(Exception):  # stderr may be closed: nothing more to do
            print(
                f"launcher.failures.record: could not write error file {path}: "
                f"{type(write_error).__name__}: {write_error}",
                file=sys.stderr,
            )
        return False


def _enable_faulthandler() -> None:
    # A worker that dies in native code (SIGSEGV, SIGABRT) writes no error file; faulthandler
    # puts the Python stack on stderr, which the launcher's report shows as the stderr tail.
    if faulthandler.is_enabled():
        return
    with contextlib.suppress(Exception):  # no usable stderr (pythonw, closed fd): go on
        faulthandler.enable(all_threads=True)


def _callstack_without_wrapper(exc: BaseException) -> str:
    # The first frame is the decorator's own wrapper: noise in every report, so it is left out.
    tb = exc.__traceback__
    if tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


@overload
def record(fn: Callable[P, R]) -> Callable[P, R | None]: ...


@overload
def record(fn: None = None) -> Callable[[Callable[P, R]], Callable[P, R | None]]: ...


def record(fn: Callable[P, R] | None = None) -> Any:
    """Decorate a worker's main function so its uncaught exception reaches the failure report.

    Use it as ``@record`` (or ``@record()``) on the function the script's ``__main__`` block
    calls. When ``TORCHELASTIC_ERROR_FILE`` is set (the launcher and torchrun set it), an
    exception escaping the function is written there, then re-raised unchanged, so the exit
    status and stderr are what they would have been. ``SystemExit(0)`` returns ``None`` (as
    torch's decorator does, so ``runpy``-style entry points finish cleanly); other
    ``SystemExit``\\ s and ``KeyboardInterrupt`` pass through unrecorded. When the variable is
    unset the decorator does nothing at all.
    """
    if fn is None:
        return record

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        # Read at call time, not decoration time: the variable may be set after import.
        path = os.environ.get(ERROR_FILE_ENV)
        if not path:
            return fn(*args, **kwargs)
        _enable_faulthandler()
        try:
            return fn(*args, **kwargs)
        except SystemExit as exit_:
            if exit_.code == 0:  # same as torch: a clean sys.exit(0) is a normal return
                return None
            raise
        except Exception as exc:
            write_error_file(path, exc, _callstack_without_wrapper(exc))
            raise

    return wrapper
