"""The workers' flags: how many, what they run, how they start, restart and stop; and ``--preload``.

Declared, parsed and checked here (:data:`FLAGS`); :func:`read_workers` gives one
:class:`WorkerSettings`, the workers' command included. ``--preload`` (workers forked from a
template that imported modules once) is a group of its own, :data:`PRELOAD_FLAGS`, declared here
rather than beside its machinery (:mod:`launcher.preload.preload`), which only a preloading launch
imports; one module fewer is also a little less start-up for every launch. The checks the Python API's
:class:`~launcher.config.LaunchConfig` shares (:func:`check_start_method`, :func:`check_role`,
:func:`check_worker_tty`, :func:`signal_numbers`) live here too, so a value is refused the same
way whichever way it came.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

import os
import signal
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import MAX_NPROC, MAX_RESTARTS, parse_int, parse_seconds, quote

if TYPE_CHECKING:  # pragma: no cover
    from launcher.plugins.manager import LauncherPluginManager
    from launcher.plugins.types import DeviceProvider

__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "FLAGS",
    "PRELOAD_FLAGS",
    "PROGRESS_FLAGS",
    "PreloadSettings",
    "MAX_MONITOR_INTERVAL",
    "START_METHODS",
    "WORKER_TTY_MODES",
    "WorkerSettings",
    "check_role",
    "check_start_method",
    "check_worker_tty",
    "parse_preload",
    "read_preload",
    "read_workers",
    "resolve_nproc",
    "signal_numbers",
]


DEFAULT_SHUTDOWN_TIMEOUT = 30.0
#: Longest --monitor-interval: one hour between membership checks is already too slow to be useful.
MAX_MONITOR_INTERVAL = 3600.0
START_METHODS = ("spawn", "fork", "forkserver")
WORKER_TTY_MODES = ("auto", "always", "never")


class WorkerSettings(NamedTuple):
    """The worker flags, checked, and the command every worker runs."""

    nproc_per_node: int
    #: The provider that counted ``--nproc-per-node`` when it named a device kind.
    device_provider: "DeviceProvider | None"
    #: argv of the worker command; empty for ``--run-path``.
    command: tuple[str, ...]
    #: For ``--run-path``: the script run in-process with runpy, and its arguments.
    run_path: tuple[str, tuple[str, ...]] | None
    no_python: bool
    max_restarts: int
    monitor_interval: float
    start_method: str
    role: str
    signals_to_handle: tuple[str, ...]
    shutdown_timeout: float
    exit_barrier_timeout: float
    virtual_local_rank: bool
    worker_tty: str
    #: ``signals_to_handle`` as numbers, read with the names (the plan needs no second reading).
    signal_numbers: tuple[int, ...]


def check_start_method(value: Any) -> str:
    """``spawn``, ``fork`` or ``forkserver``."""
    if value not in START_METHODS:
        raise UsageError(f"--start-method must be spawn, fork or forkserver, got {quote(value)}")
    return str(value)


def check_role(value: Any) -> str:
    """A non-empty, printable role name."""
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise UsageError(f"--role must be a non-empty name without control characters, got {quote(value)}")
    return value


def check_worker_tty(value: Any) -> str:
    """``auto``, ``always`` or ``never``."""
    if value not in WORKER_TTY_MODES:
        raise UsageError(f"--worker-tty must be auto, always or never, got {quote(value)}")
    return str(value)


def signal_numbers(names: Sequence[str]) -> list[int]:
    """Signal numbers for names like ``SIGTERM`` (or ``TERM``)."""
    numbers = []
    if not any(name.strip() for name in names):
        raise UsageError(
            f"--signals-to-handle {quote(','.join(names))} names no signal; use names like SIGTERM,SIGINT,SIGUSR1"
        )
    for raw in names:
        name = raw.strip().upper()
        if not name:
            raise UsageError(
                f"--signals-to-handle {quote(','.join(names))} has an empty item; use names like SIGTERM,SIGINT,SIGUSR1"
            )
        if not name.startswith("SIG"):
            name = "SIG" + name
        number = getattr(signal, name, None)
        if not isinstance(number, signal.Signals) or name in ("SIGKILL", "SIGSTOP", "SIGCHLD"):
            raise UsageError(
                f"--signals-to-handle: {quote(raw.strip())} is not a signal the launcher can forward; "
                "use names like SIGTERM,SIGINT,SIGUSR1"
            )
        numbers.append(int(number))
    return numbers


def resolve_nproc(value: str, manager: "LauncherPluginManager | None",
                  name: str = "--nproc-per-node") -> "tuple[int, DeviceProvider | None]":
    """An integer from 1 to :data:`~launcher.values.MAX_NPROC`, or a device kind counted by its provider."""
    # A device kind's name starts with a letter ("cuda", "gaudi2"); anything else ("1e3", "-2",
    # "٣", "²", "1_0", "+2", " 2", "") is a count, read as plain ASCII decimal like every number.
    if not value[:1].isalpha():
        return parse_int(value, name, 1, MAX_NPROC), None  # the common case loads no provider
    from launcher.devices import resolve_nproc_per_node

    if manager is None:
        from launcher.plugins.manager import get_plugin_manager

        manager = get_plugin_manager()
    count, provider = resolve_nproc_per_node(value, manager)
    if count > MAX_NPROC:
        raise UsageError(f"{name} {quote(value)} counts {count} devices; at most {MAX_NPROC} workers per node")
    return count, provider


def _which(program: str) -> str | None:
    import shutil  # here: shutil costs every launch milliseconds before its first worker starts

    return shutil.which(program)


def _python_program(env: Mapping[str, str]) -> str:
    """``PYTHON_EXEC`` when set (checked to name a program), else this interpreter."""
    python = env.get("PYTHON_EXEC")
    if python is None:
        return sys.executable
    found = _which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if not python.strip() or found is None or os.path.isdir(found):
        raise UsageError(f"PYTHON_EXEC={quote(python)} names no executable program; unset it to use {sys.executable}")
    return python


def _worker_command(values: FlagValues, no_python: bool) -> tuple[list[str], tuple[str, tuple[str, ...]] | None]:
    """The worker's argv, or for ``--run-path`` the script and its arguments."""
    script: str = values["training_script"]
    script_args: list[str] = list(values["training_script_args"])
    module = bool(values["module"])
    if not script.strip():
        kind = "module" if module else "program" if no_python else "script"
        raise UsageError(f"the {kind} name is empty: give the {kind} each worker runs")
    if no_python and module:
        raise UsageError("--no-python and -m/--module cannot be used together: pick one")
    if values["run_path"]:
        path = os.path.abspath(script)
        if not os.path.isfile(path):
            raise UsageError(f"script {quote(script)} not found (--run-path needs a Python file)")
        return [], (path, tuple(script_args))
    if no_python:
        if os.sep in script:
            if not (os.path.isfile(script) and os.access(script, os.X_OK)):
                raise UsageError(f"program {quote(script)} not found or not executable (--no-python runs it directly)")
        elif _which(script) is None:
            raise UsageError(f"program {quote(script)} not found on PATH (--no-python runs it directly)")
        return [script, *script_args], None
    if module:
        if not all(part.isidentifier() for part in script.split(".")):
            raise UsageError(f"-m {quote(script)} is not a module name: use dotted names like package.module")
        return [_python_program(values.environ), "-u", "-m", script, *script_args], None
    if not os.path.isfile(script):
        hint = " (use -m to run a module, or --no-python for a program)" if not script.endswith(".py") else ""
        raise UsageError(f"script {quote(script)} not found{hint}")
    return [_python_program(values.environ), "-u", script, *script_args], None


def read_workers(values: FlagValues) -> WorkerSettings:
    """The worker flags and the script, checked; a device kind given to ``--nproc-per-node`` counted."""
    no_python = bool(values["no_python"])
    command, run_path = _worker_command(values, no_python)
    nproc, provider = resolve_nproc(values["nproc_per_node"], values.manager, values.source("nproc_per_node"))
    shutdown_timeout, shutdown_name = values["shutdown_timeout"], values.source("shutdown_timeout")
    if shutdown_timeout is None:
        shutdown_timeout = values.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT)
        shutdown_name = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
    signals = tuple(values["signals_to_handle"].split(","))
    numbers = tuple(signal_numbers(signals))
    return WorkerSettings(
        nproc_per_node=nproc,
        device_provider=provider,
        command=tuple(command),
        run_path=run_path,
        no_python=no_python,
        max_restarts=parse_int(values["max_restarts"], values.source("max_restarts"), 0, MAX_RESTARTS),
        monitor_interval=parse_seconds(values["monitor_interval"], values.source("monitor_interval"),
                                       MAX_MONITOR_INTERVAL, zero=False),
        start_method=check_start_method(values["start_method"]),
        role=check_role(values["role"]),
        signals_to_handle=signals,
        shutdown_timeout=parse_seconds(shutdown_timeout, shutdown_name),
        exit_barrier_timeout=parse_seconds(values["exit_barrier_timeout"], values.source("exit_barrier_timeout")),
        virtual_local_rank=bool(values["virtual_local_rank"]),
        worker_tty=check_worker_tty(values["worker_tty"].strip().lower()),
        signal_numbers=numbers,
    )


FLAGS: FlagGroup[WorkerSettings] = FlagGroup(
    name="workers",
    title="workers (how many, what they run, restarts and stopping)",
    read=read_workers,
    flags=(
        Flag("--nproc-per-node", default="1", torchrun=True,
             help="Workers per node: an integer, or a device kind (cpu, cuda/gpu, xpu, auto, or an "
             "installed device provider's name)."),
        Flag("--max-restarts", default="0", torchrun=True,
             help="Restarts of the worker group before the job fails (default 0)."),
        Flag("--monitor-interval", default="0.1", torchrun=True,
             help="Seconds between checks for joining or lost nodes while workers run (at least 1; worker "
             "exits are noticed at once)."),
        Flag("--start-method", default="spawn", torchrun=True,
             help="spawn, fork or forkserver (function entrypoints only)."),
        Flag("--role", default="default", torchrun=True, help="Worker role name (default 'default')."),
        Flag("--module", short="-m", switch=True, torchrun=True,
             help="Run the script as a module, like 'python -m'."),
        Flag("--no-python", switch=True, torchrun=True, help="Run the script as an executable, without python."),
        Flag("--run-path", switch=True, torchrun=True, help="Run the script with runpy.run_path."),
        Flag("--signals-to-handle", default="SIGTERM,SIGINT,SIGHUP,SIGQUIT", torchrun=True,
             help="Signals forwarded to the workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)."),
        Flag("--shutdown-timeout", default=None, torchrun=True,
             help="Seconds between a forwarded signal and SIGKILL (default TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30)."),
        Flag("--virtual-local-rank", switch=True, torchrun=True,
             help="Every worker sees LOCAL_RANK=0 and exactly one device."),
        Flag("--exit-barrier-timeout", default="300",
             help="Seconds a finished node waits for the others before exiting (default 300)."),
        Flag("--worker-tty", default="auto",
             help="Give workers pseudo-terminals (progress bars, colours): auto when the launcher's own "
             "output is a terminal, always, or never (pipes, as before; default auto)."),
    ),
)


# -- --preload: its own group (its machinery, launcher.preload.preload, is imported only when used) --


class PreloadSettings(NamedTuple):
    """The modules to preload, each once, in order (empty: workers start normally); ``source``
    names where they came from (the plan says it does not apply with ``--no-python``)."""

    modules: tuple[str, ...] = ()
    source: str = "--preload"


def parse_preload(value: str | Iterable[str] | None, name: str = "--preload") -> tuple[str, ...]:
    """``torch,numpy`` (or a sequence of names) as a tuple of module names; a one-line error otherwise."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    modules: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise UsageError(f"{name}: module names must be strings, got {quote(item)}")
        module = item.strip()
        if not module:
            continue
        if not all(part.isidentifier() for part in module.split(".")):
            raise UsageError(f"{name} {quote(module)} is not a module name: use dotted names like torch or torch.nn")
        if module not in modules:
            modules.append(module)
    return tuple(modules)


def read_preload(values: FlagValues) -> PreloadSettings:
    """``--preload``, checked (the plan leaves it out, saying so once, for ``--no-python``)."""
    name = values.source("preload")
    return PreloadSettings(parse_preload(values["preload"], name), name)


PRELOAD_FLAGS: FlagGroup[PreloadSettings] = FlagGroup(
    name="preload",
    title="preloading",
    read=read_preload,
    flags=(
        Flag("--preload", default="", underscore=False,
             help="Comma list of modules ('torch', ...) that a template process imports once per node; every "
             "worker, at each start and restart, is forked from it instead of importing them again "
             "(default: none)."),
    ),
)


#: ``--max-no-progress-restarts`` when not given (:data:`launcher.agent.progress.DEFAULT_LIMIT`,
#: repeated here so that a launch that does not use the flag never imports that module).
DEFAULT_NO_PROGRESS_RESTARTS = 3

#: Declared here for the same reason as ``--preload``; read by :func:`launcher.agent.progress.read_progress`.
PROGRESS_FLAGS: FlagGroup[int] = FlagGroup(
    name="progress",
    title="restarts without progress",
    read="launcher.agent.progress:read_progress",
    unset=DEFAULT_NO_PROGRESS_RESTARTS,
    flags=(
        Flag("--max-no-progress-restarts", default=str(DEFAULT_NO_PROGRESS_RESTARTS),
             help="Stop restarting, and exit 93 (do not requeue), once this many restarts in a row ended before "
             "the job passed the furthest step its ranks gave launcher.heartbeat(step); jobs that give no step "
             f"are never stopped. 0: off (default: {DEFAULT_NO_PROGRESS_RESTARTS})."),
    ),
)
