"""The validated description of a launch, and how the command line becomes one.

:class:`LaunchConfig` is both the Python API's input and what the CLI builds from its flags, so
the two paths validate the same way. Validation happens before anything starts: every problem
is a :class:`~launcher.errors.UsageError` with one line that says what is wrong and what would be
right.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.errors import UsageError
from launcher.rendezvous.endpoint import check_host, format_endpoint
from launcher.values import (
    MAX_NODES,
    MAX_NPROC,
    MAX_RESTARTS,
    parse_int,
    parse_seconds,
    quote,
    read_float,
    read_int,
)

if TYPE_CHECKING:  # pragma: no cover
    import argparse

    from launcher.plugins.manager import LauncherPluginManager
    from launcher.plugins.types import DeviceProvider

log = logging.getLogger("launcher")

#: Std bitmask values, as torchrun's ``Std``: which streams go to files.
STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3

StdSpec = int | dict[int, int]

DEFAULT_MASTER_PORT = 29500
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
#: Longest --monitor-interval: one hour between membership checks is already too slow to be useful.
MAX_MONITOR_INTERVAL = 3600.0


@dataclass
class LaunchConfig:
    """Everything the agent needs to run one node of a job.

    The fields and their defaults follow ``torch.distributed.launcher.api.LaunchConfig`` where one
    exists. ``rdzv_backend="c10d"`` with no endpoint and ``max_nodes=1`` runs a local, single-node
    rendezvous that needs no torch import (what ``--standalone`` does).
    """

    min_nodes: int = 1
    max_nodes: int = 1
    nproc_per_node: int = 1
    run_id: str = ""
    role: str = "default"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "c10d"
    rdzv_configs: dict[str, Any] = field(default_factory=dict)
    max_restarts: int = 0
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    log_dir: str | None = None
    redirects: StdSpec = STD_NONE
    tee: StdSpec = STD_NONE
    local_ranks_filter: set[int] | None = None
    duplicate_stdout_filters: list[str] = field(default_factory=list)
    duplicate_stderr_filters: list[str] = field(default_factory=list)
    #: A LogsSpecs plugin name, a LogsSpecs instance, or ``None`` for the default layout.
    logs_specs: Any = None
    #: Event sink names.
    event_log_handlers: list[str] = field(default_factory=lambda: ["null"])
    local_addr: str | None = None
    signals_to_handle: Sequence[str] = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    exit_barrier_timeout: float = 300.0
    virtual_local_rank: bool = False
    #: Device provider name behind ``--nproc-per-node`` (for ``--virtual-local-rank``), if any.
    device_kind: str | None = None
    numa_binding: str | None = None
    numa_fallback: str = "warn"
    #: ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``; ``None`` gives ``[<role><local_rank>]:``.
    log_line_prefix_template: str | None = None
    #: Extra environment for every worker (the Python API's way to pass settings).
    worker_env: dict[str, str] = field(default_factory=dict)
    #: ``--worker-tty``: pseudo-terminals for workers: ``auto`` (when the launcher's console is a
    #: terminal), ``always`` or ``never`` (pipes, whole lines).
    worker_tty: str = "auto"
    #: Seconds without progress after which a rank is hung (``None``: no hang detection).
    hang_timeout: float | None = None
    #: What counts as progress: ``heartbeat`` (launcher.heartbeat() calls) or ``output`` (those or any line).
    hang_watch: str = "heartbeat"

    def __post_init__(self) -> None:
        if not self.run_id:
            self.run_id = new_run_id()
        self.validate()

    def validate(self) -> None:
        """Check the fields that need no plugin; raise :class:`UsageError` on the first problem.

        Numbers go through :mod:`launcher.values`, as the command line's do: ASCII, finite, in range.
        """
        self.min_nodes = parse_int(self.min_nodes, "LaunchConfig.min_nodes", 1, MAX_NODES)
        self.max_nodes = parse_int(self.max_nodes, "LaunchConfig.max_nodes", self.min_nodes, MAX_NODES)
        self.nproc_per_node = parse_int(self.nproc_per_node, "--nproc-per-node", 1, MAX_NPROC)
        self.max_restarts = parse_int(self.max_restarts, "--max-restarts", 0, MAX_RESTARTS)
        self.monitor_interval = parse_seconds(
            self.monitor_interval, "--monitor-interval", MAX_MONITOR_INTERVAL, zero=False
        )
        if self.start_method not in ("spawn", "fork", "forkserver"):
            raise UsageError(f"--start-method must be spawn, fork or forkserver, got {quote(self.start_method)}")
        self.shutdown_timeout = parse_seconds(self.shutdown_timeout, "--shutdown-timeout")
        self.exit_barrier_timeout = parse_seconds(self.exit_barrier_timeout, "--exit-barrier-timeout")
        if self.numa_fallback not in ("warn", "error"):
            raise UsageError(f"--numa-fallback must be warn or error, got {quote(self.numa_fallback)}")
        if not isinstance(self.role, str) or not self.role.strip() or not self.role.isprintable():
            raise UsageError(f"--role must be a non-empty name without control characters, got {quote(self.role)}")
        if self.worker_tty not in ("auto", "always", "never"):
            raise UsageError(f"--worker-tty must be auto, always or never, got {quote(self.worker_tty)}")
        for spec, flag in ((self.redirects, "--redirects"), (self.tee, "--tee")):
            _check_std(spec, flag, self.nproc_per_node)
        if self.local_ranks_filter is not None:
            for rank in self.local_ranks_filter:
                parse_int(rank, "--local-ranks-filter rank", 0, self.nproc_per_node - 1)
        signal_numbers(self.signals_to_handle)
        from launcher.hangs.settings import parse_hang_timeout, parse_hang_watch

        self.hang_timeout = parse_hang_timeout(self.hang_timeout)
        self.hang_watch = parse_hang_watch(self.hang_watch)

    @property
    def signal_numbers(self) -> list[int]:
        return signal_numbers(self.signals_to_handle)


def _check_std(spec: StdSpec, flag: str, nproc: int) -> None:
    values = spec.values() if isinstance(spec, dict) else [spec]
    for value in values:
        if isinstance(value, bool) or value not in (0, 1, 2, 3):
            raise UsageError(f"{flag} values must be 0, 1, 2 or 3, got {quote(value)}")
    if isinstance(spec, dict):
        for rank in spec:
            parse_int(rank, f"{flag} local rank", 0, nproc - 1)


def signal_numbers(names: Sequence[str]) -> list[int]:
    """Signal numbers for names like ``SIGTERM`` (or ``TERM``)."""
    numbers = []
    for raw in names:
        name = raw.strip().upper()
        if not name:
            continue
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


def new_run_id() -> str:
    """A random job id (what ``uuid.uuid4().hex`` gives, without importing uuid)."""
    return os.urandom(16).hex()


def _which(program: str) -> str | None:
    import shutil

    return shutil.which(program)


# -- parsing of individual flag values ----------------------------------------------------------


def parse_nnodes(value: str, name: str = "--nnodes") -> tuple[int, int]:
    """``N`` or ``MIN:MAX``, each an integer from 1 to :data:`~launcher.values.MAX_NODES`."""
    parts = value.strip().split(":")
    hint = f"{name} must be N or MIN:MAX with integers from 1 to {MAX_NODES}, e.g. 2 or 1:4; got {quote(value)}"
    numbers = [read_int(part) for part in parts]
    if len(parts) > 2 or any(n is None or not 1 <= n <= MAX_NODES for n in numbers):
        raise UsageError(hint)
    low, high = numbers[0], numbers[-1]
    assert low is not None and high is not None
    if low > high:
        raise UsageError(f"{name} {quote(value)} is invalid: need MIN <= MAX, e.g. 2 or 1:4")
    return low, high


def parse_std(value: str, flag: str) -> StdSpec:
    """torchrun's Std format: ``3`` for every rank, or ``0:1,1:2`` per local rank."""
    text = value.strip()
    hint = f"{flag} {quote(value)} is invalid: use 0-3 for every rank, or LOCAL_RANK:0-3 pairs like 0:1,1:2"
    if text == "":
        return STD_NONE
    if ":" not in text:
        if text not in ("0", "1", "2", "3"):
            raise UsageError(hint)
        return int(text)
    mapping: dict[int, int] = {}
    for item in text.split(","):
        rank_text, sep, std = item.partition(":")
        rank = read_int(rank_text)
        if not sep or rank is None or std.strip() not in ("0", "1", "2", "3"):
            raise UsageError(hint)
        if rank in mapping:
            raise UsageError(f"{flag} {quote(value)} names local rank {rank} twice")
        mapping[rank] = int(std)
    return mapping


def parse_rdzv_conf(value: str) -> dict[str, str]:
    """``key1=value1,key2=value2``; an empty value is an error (it would silently mean the default)."""
    conf: dict[str, str] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(
                f"--rdzv-conf item {quote(item)} is invalid: use key=value pairs, e.g. join_timeout=900"
            )
        if not val.strip():
            raise UsageError(
                f"--rdzv-conf {quote(key.strip())} has no value: give key=value, or leave the key out for its default"
            )
        conf[key.strip()] = val.strip()
    return conf


def parse_ranks_filter(value: str, name: str = "--local-ranks-filter") -> set[int] | None:
    """Comma list of local ranks (``0,2``); empty means every rank."""
    text = value.strip()
    if not text:
        return None
    ranks = set()
    for item in text.split(","):
        rank = read_int(item)
        if rank is None or not 0 <= rank < MAX_NPROC:
            raise UsageError(
                f"{name} {quote(value)} is invalid: use a comma list of local ranks from 0 to {MAX_NPROC - 1}, "
                "e.g. 0,1,2"
            )
        ranks.add(rank)
    return ranks


def parse_filters(value: str | Sequence[str]) -> list[str]:
    """Comma list where ``,,`` stands for a literal comma."""
    if not isinstance(value, str):
        return list(value)
    placeholder = "\x00"
    items = value.replace(",,", placeholder).split(",")
    return [item.replace(placeholder, ",") for item in items if item]


# -- the command line ---------------------------------------------------------------------------


@dataclass
class CommandLine:
    """What the CLI runs: the validated config and each worker's command."""

    config: LaunchConfig
    #: argv of the worker command (``${local_rank}`` substituted per worker); empty for run-path.
    command: list[str]
    #: For ``--run-path``: the script run in-process with runpy, and its arguments.
    run_path: tuple[str, list[str]] | None = None
    device_provider: DeviceProvider | None = None


def resolve_nproc(value: str, manager: LauncherPluginManager,
                  name: str = "--nproc-per-node") -> tuple[int, DeviceProvider | None]:
    """An integer from 1 to :data:`~launcher.values.MAX_NPROC`, or a device kind counted by its provider."""
    text = value.strip()
    # Anything number-like ("1e3", "-2", "٣", "²", "") is read as a count, never as a device kind;
    # a name with digits in it ("gaudi2") is still a device kind.
    if not text or read_float(text) is not None or all(ch.isnumeric() or ch in "+-." for ch in text):
        return parse_int(text, name, 1, MAX_NPROC), None  # the common case loads no provider
    from launcher.devices import resolve_nproc_per_node

    count, provider = resolve_nproc_per_node(value, manager)
    if count > MAX_NPROC:
        raise UsageError(f"{name} {quote(value)} counts {count} devices; at most {MAX_NPROC} workers per node")
    return count, provider


def _python_program(env: Mapping[str, str]) -> str:
    """``PYTHON_EXEC`` when set (checked to name a program), else this interpreter."""
    python = env.get("PYTHON_EXEC")
    if python is None:
        return sys.executable
    found = _which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if not python.strip() or found is None or os.path.isdir(found):
        raise UsageError(f"PYTHON_EXEC={quote(python)} names no executable program; unset it to use {sys.executable}")
    return python


def _worker_command(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[list[str], tuple[str, list[str]] | None]:
    """The worker's argv, or for ``--run-path`` the script and its arguments."""
    script: str = args.training_script
    script_args: list[str] = list(args.training_script_args)
    if not script.strip():
        kind = "module" if args.module else "program" if args.no_python else "script"
        raise UsageError(f"the {kind} name is empty: give the {kind} each worker runs")
    if args.no_python and args.module:
        raise UsageError("--no-python and -m/--module cannot be used together: pick one")
    if args.run_path:
        path = os.path.abspath(script)
        if not os.path.isfile(path):
            raise UsageError(f"script {quote(script)} not found (--run-path needs a Python file)")
        return [], (path, script_args)
    if args.no_python:
        if os.sep in script:
            if not (os.path.isfile(script) and os.access(script, os.X_OK)):
                raise UsageError(f"program {quote(script)} not found or not executable (--no-python runs it directly)")
        elif _which(script) is None:
            raise UsageError(f"program {quote(script)} not found on PATH (--no-python runs it directly)")
        return [script, *script_args], None
    if args.module:
        if not all(part.isidentifier() for part in script.split(".")):
            raise UsageError(f"-m {quote(script)} is not a module name: use dotted names like package.module")
        return [_python_program(env), "-u", "-m", script, *script_args], None
    if not os.path.isfile(script):
        hint = " (use -m to run a module, or --no-python for a program)" if not script.endswith(".py") else ""
        raise UsageError(f"script {quote(script)} not found{hint}")
    return [_python_program(env), "-u", script, *script_args], None


def config_from_args(args: argparse.Namespace, manager: LauncherPluginManager,
                     environ: Mapping[str, str] | None = None) -> CommandLine:
    """Validate parsed flags and build the launch; raises :class:`UsageError`.

    Messages name where a value came from: the flag, or its ``PET_*`` variable.
    """
    from launcher.options import source_name

    def name(dest: str) -> str:
        return source_name(args, dest)

    env = os.environ if environ is None else environ
    min_nodes, max_nodes = parse_nnodes(args.nnodes, name("nnodes"))
    command, run_path = _worker_command(args, env)
    nproc, provider = resolve_nproc(args.nproc_per_node, manager, name("nproc_per_node"))

    rdzv_conf = parse_rdzv_conf(args.rdzv_conf)
    if args.standalone:
        backend, endpoint, run_id = "c10d", "localhost:0", new_run_id()
    else:
        backend, endpoint, run_id = args.rdzv_backend.strip().lower(), args.rdzv_endpoint, args.rdzv_id
    if backend == "static":
        if min_nodes != max_nodes:
            raise UsageError(f"--nnodes {args.nnodes}: the static backend needs a fixed size; use c10d for MIN:MAX")
        node_rank = parse_int(args.node_rank, name("node_rank"), 0, max_nodes - 1)
        rdzv_conf["rank"] = str(node_rank)
        if not endpoint.strip():
            port = DEFAULT_MASTER_PORT
            if args.master_port is not None:
                port = parse_int(args.master_port, name("master_port"), 0, 65535)
            host = check_host(args.master_addr.strip(), name("master_addr"))
            endpoint = format_endpoint(host, port)
    if args.local_addr is not None:
        check_host(args.local_addr.strip(), name("local_addr"))

    shutdown_timeout = args.shutdown_timeout
    shutdown_name = name("shutdown_timeout")
    if shutdown_timeout is None:
        shutdown_timeout = env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT)
        shutdown_name = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"

    config = LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc,
        run_id=run_id,
        role=args.role,
        rdzv_endpoint=endpoint,
        rdzv_backend=backend,
        rdzv_configs=dict(rdzv_conf),
        max_restarts=parse_int(args.max_restarts, name("max_restarts"), 0, MAX_RESTARTS),
        monitor_interval=parse_seconds(
            args.monitor_interval, name("monitor_interval"), MAX_MONITOR_INTERVAL, zero=False
        ),
        start_method=args.start_method,
        log_dir=args.log_dir or None,
        redirects=_std_for(parse_std(args.redirects, name("redirects")), name("redirects"), nproc),
        tee=_std_for(parse_std(args.tee, name("tee")), name("tee"), nproc),
        local_ranks_filter=parse_ranks_filter(args.local_ranks_filter, name("local_ranks_filter")),
        duplicate_stdout_filters=parse_filters(args.duplicate_stdout_filters),
        duplicate_stderr_filters=parse_filters(args.duplicate_stderr_filters),
        logs_specs=args.logs_specs,
        event_log_handlers=[n.strip() for n in args.event_log_handler.split(",") if n.strip()] or ["null"],
        local_addr=args.local_addr,
        signals_to_handle=[s for s in args.signals_to_handle.split(",") if s.strip()],
        shutdown_timeout=parse_seconds(shutdown_timeout, shutdown_name),
        exit_barrier_timeout=parse_seconds(args.exit_barrier_timeout, name("exit_barrier_timeout")),
        virtual_local_rank=bool(args.virtual_local_rank),
        device_kind=provider.name if provider is not None else None,
        numa_binding=args.numa_binding,
        numa_fallback=args.numa_fallback,
        log_line_prefix_template=env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
        worker_tty=args.worker_tty.strip().lower(),
        hang_timeout=args.hang_timeout,
        hang_watch=args.hang_watch,
    )
    preflight(config, manager)
    return CommandLine(config=config, command=command, run_path=run_path, device_provider=provider)


def _std_for(spec: StdSpec, flag: str, nproc: int) -> StdSpec:
    """``spec`` after checking its local ranks against this node's worker count."""
    _check_std(spec, flag, nproc)
    return spec


def preflight(config: LaunchConfig, manager: LauncherPluginManager) -> None:
    """Every check that needs plugins or the machine, before anything starts (CLI and Python API)."""
    validate_plugins(config, manager)
    if config.log_dir:
        check_log_dir(config.log_dir)
    from launcher.limits import check_worker_limits

    check_worker_limits(config.nproc_per_node)


def check_log_dir(path: str) -> None:
    """``path`` exists as a writable directory afterwards (created if missing), or a one-line error.

    Creating it is what the logs would do a moment later; doing it now turns a traceback in the
    middle of the start into a usage error before it.
    """
    if path == os.devnull:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--log-dir {quote(path)} is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"--log-dir {quote(path)} cannot be created or written: {reason}") from None


def validate_plugins(config: LaunchConfig, manager: LauncherPluginManager) -> None:
    """Check that every plugin the config names exists (and its settings), before any start."""
    from launcher.rendezvous.registry import check_rendezvous_config

    check_rendezvous_config(config, manager)
    if isinstance(config.logs_specs, str):
        manager.get("logs specs", config.logs_specs)
    for name in config.event_log_handlers:
        manager.get("event handler", name)
    if config.numa_binding:
        manager.get("numa strategy", config.numa_binding)
