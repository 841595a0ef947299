"""The built-in checks other than ``gpu`` (:mod:`launcher.health.gpu`): ``disk``, ``python``,
``command``. Each answers healthy, sick with one line, or skipped with one line."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

from launcher.errors import UsageError
from launcher.health.api import CheckContext, CheckResult, healthy, sick, skipped
from launcher.health.runner import run_process
from launcher.values import quote, read_float

__all__ = ["MIN_FREE_BYTES", "MIN_FREE_ENV", "check_command", "check_disk", "check_python", "min_free_bytes",
           "proves_nothing", "python_imports"]

#: Free space the ``disk`` check wants under the log directory and the temporary directory, by
#: default: 1 GiB, room for logs, error files, stack dumps and compile caches.
MIN_FREE_BYTES = 1 << 30
#: The variable that sets another threshold, in GiB (``LAUNCHER_HEALTH_MIN_FREE_GIB=20``).
MIN_FREE_ENV = "LAUNCHER_HEALTH_MIN_FREE_GIB"


def min_free_bytes(env: Mapping[str, str]) -> int:
    """The ``disk`` threshold: :data:`MIN_FREE_ENV` when set (a number of GiB, 0 or more),
    else :data:`MIN_FREE_BYTES`. A value that is not a number is refused when the plan is built."""
    text = env.get(MIN_FREE_ENV, "").strip()
    if not text:
        return MIN_FREE_BYTES
    value = read_float(text)
    if value is None or value < 0:
        raise UsageError(f"{MIN_FREE_ENV}={quote(text)} must be a number of GiB, 0 or more (e.g. 20)")
    return int(value * (1 << 30))


def _existing(path: str) -> str:
    """``path``, or its nearest existing parent (a log directory is created at the first start)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_disk(context: CheckContext) -> CheckResult:
    """Sick when the log directory (``--log-dir``) or the temporary directory has less than
    :func:`min_free_bytes` free for this user (``statvfs``: blocks available to non-root)."""
    needed = min_free_bytes(context.env)
    places = [("the temporary directory", context.temp_dir)]
    if context.log_dir:
        places.insert(0, ("--log-dir", context.log_dir))
    seen: set[int] = set()
    for what, path in places:
        where = _existing(path)
        try:
            stats = os.statvfs(where)
        except OSError as exc:
            return sick(f"cannot read the free space of {what} {path}: {exc.strerror or exc}")
        if stats.f_fsid in seen and stats.f_fsid:
            continue
        seen.add(stats.f_fsid)
        free = stats.f_bavail * stats.f_frsize
        if free < needed:
            return sick(f"{what} {path} has {_gib(free)} free, below the {_gib(needed)} needed ({MIN_FREE_ENV})")
    return healthy()


def python_imports(context: CheckContext) -> list[str]:
    """What the ``python`` check imports: the ``-m`` entrypoint's top-level package (a plain
    script: nothing, the interpreter only has to start).

    Not the ``--preload`` modules: the preload template imports them itself, once per node, before
    any worker, and says in one line when one cannot be imported. Importing them here too would
    pay their import (seconds for torch) again before every round, which is what --preload is
    there to save.
    """
    return [context.module.split(".")[0]] if context.module else []


#: The variables a Python interpreter reads while it starts (before the script runs): its own
#: ``PYTHON*`` settings, the dynamic loader's ``LD_*``, the locale, and ``HOME`` (the user's
#: site-packages). Two environments that agree on these start an interpreter the same way.
_START_PREFIXES = ("PYTHON", "LD_", "LC_")
_START_NAMES = ("HOME", "LANG")


def _start_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_START_PREFIXES) or k in _START_NAMES}


def proves_nothing(context: CheckContext) -> str | None:
    """Why running the ``python`` check would prove nothing the agent's own start did not, or
    ``None`` when it must run.

    It proves nothing when the workers run a script (no ``-m`` package to import) with this very
    interpreter (the same path, started without ``-I``, ``-E`` or ``-S``, which skip what a worker
    does) and the interpreter's start sees the same environment (:data:`_START_PREFIXES`,
    :data:`_START_NAMES`): the agent's own start was that check.
    """
    if context.python is None or context.module is not None or context.script is None:
        return None
    if context.python != sys.executable:
        return None
    flags = sys.flags
    if flags.isolated or flags.ignore_environment or flags.no_site or flags.no_user_site:
        return None
    if _start_variables(context.env) != _start_variables(os.environ):
        return None
    return (f"the workers' interpreter is this agent's own ({context.python}), running a script in the same "
            "environment: the agent's start already proved it starts")


def check_python(context: CheckContext) -> CheckResult:
    """The workers' interpreter starts (in the workers' environment) and imports
    :func:`python_imports`. Skipped with ``--no-python``, and when :func:`proves_nothing` says why."""
    if context.python is None:
        return skipped("the workers run a program, not Python (--no-python)")
    needless = proves_nothing(context)
    if needless is not None:
        return skipped(needless)
    names = python_imports(context)
    code = "pass"
    if context.module and "." not in context.module:
        # ``-m train``: the module is the script itself; importing it would run the job. Only
        # look it up, which runs nothing of it.
        missing = f"No module named {context.module!r}"
        code = (f"import importlib.util\nif importlib.util.find_spec({context.module!r}) is None: "
                f"raise ModuleNotFoundError({missing!r})")
    elif names:  # ``-m pkg.train``: the package is imported, as the worker will
        code = f"import {', '.join(names)}"
    argv = [context.python, "-c", code]
    try:
        result = run_process(argv, context.time_limit, env=context.env or None)
    except OSError as exc:
        return sick(f"the workers' interpreter {context.python} cannot start: {exc.strerror or exc}")
    what = f"importing {', '.join(names)}" if names else "starting"
    if result.returncode is None:
        return sick(f"the workers' interpreter did not finish {what} within {context.time_limit:g} s")
    if result.returncode != 0:
        lines = [line.strip() for line in result.output.splitlines() if line.strip()]
        # The exception is the last line of a traceback.
        why = lines[-1] if lines else f"exit status {result.returncode}, no output"
        return sick(f"the workers' interpreter failed {what}: {why}")
    return healthy()


def check_command(context: CheckContext) -> CheckResult:
    """``--health-check-cmd``: exit status 0 is healthy; anything else is sick, the reason the
    first line it printed. Skipped when no command is configured. Runs in the agent's
    environment, in a process group of its own that is killed at the time limit."""
    if context.command is None:
        return skipped("no --health-check-cmd given")
    try:
        result = run_process([context.command], context.time_limit, env=os.environ)
    except OSError as exc:
        return sick(f"{context.command} cannot run: {exc.strerror or exc}")
    if result.returncode is None:
        return sick(f"{context.command} did not finish within {context.time_limit:g} s; it was killed")
    if result.returncode == 0:
        return healthy()
    if result.returncode < 0:
        try:
            ended = f"was killed by {signal.Signals(-result.returncode).name}"
        except ValueError:
            ended = f"was killed by signal {-result.returncode}"
    else:
        ended = f"exited with status {result.returncode}"
    line = result.first_line
    return sick(f"{line} ({context.command} {ended})" if line else f"{context.command} {ended} and printed nothing")

