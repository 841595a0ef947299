"""Recognising the abort of a process whose process group outlived its code: SIGABRT at interpreter exit.

A script that ends with a gloo process group still alive (no ``destroy_process_group()``, as many
examples and PyTorch's own test scripts do) can die as its interpreter shuts down: a gloo thread
drops its last reference to a finished collective a moment after the collective returned, and if
Python has begun finalising by then the thread cannot take the GIL, CPython ends it with
``pthread_exit``, and unwinding through C++ destructors calls ``std::terminate``. The process
dies of SIGABRT with ``terminate called without an active exception`` as its last stderr line,
after everything it meant to print. Under torchrun, without ``--run-path``, such a script fails
about half its runs; under launcher, ``--run-path`` workers tear the group down themselves
(:mod:`launcher.preload.exit_teardown`), script workers cannot have that without running other code
than the user's script.
"""

from __future__ import annotations

import signal as signal_module
from collections.abc import Sequence

#: What libstdc++ prints when ``std::terminate`` is called with no exception in flight.
TERMINATE_LINE = "terminate called without an active exception"

_HINT = (
    "end the script with torch.distributed.destroy_process_group() (its process group was still "
    "alive: a gloo thread needed Python after the interpreter had begun to exit)"
)


def is_terminate_at_exit(signum: int | None, stderr_tail: Sequence[str]) -> bool:
    """Whether the worker died of SIGABRT with libstdc++'s bare ``std::terminate`` as its last stderr line."""
    if signum != signal_module.SIGABRT:
        return False
    lines = [line.strip() for line in stderr_tail if line.strip()]
    return bool(lines) and lines[-1].endswith(TERMINATE_LINE)


def explain_terminate_at_exit(code_finished: bool) -> str:
    """The report's "why" for :func:`is_terminate_at_exit`; ``code_finished``: the worker's code is
    known to have returned (a function worker whose result the agent had taken)."""
    if code_finished:
        return ("aborted during interpreter shutdown, after its code had finished and the launcher had "
                "its result: C++ std::terminate ('" + TERMINATE_LINE + "'); " + _HINT)
    return ("aborted after its last output, most likely during interpreter shutdown: C++ std::terminate ('"
            + TERMINATE_LINE + "') is how a process dies when its process group outlives the script; " + _HINT)
