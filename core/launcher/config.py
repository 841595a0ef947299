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

    def __post_init__(self) -> None:
        if not self.run_id:
            self.run_id = new_run_id()
        self.validate()

    def validate(self) -> None:
        """Check the fields that need no plugin; raise :class:`UsageError` on the first problem."""
        if not (isinstance(self.min_nodes, int) and isinstance(self.max_nodes, int)):
            raise UsageError("min_nodes and max_nodes must be integers")
        if not 0 < self.min_nodes <= self.max_nodes:
            raise UsageError(
                f"--nnodes {self.min_nodes}:{self.max_nodes} is invalid: need 0 < MIN <= MAX, e.g. 2 or 2:4"
            )
        if not isinstance(self.nproc_per_node, int) or self.nproc_per_node < 1:
            raise UsageError(f"--nproc-per-node must be a positive integer, got {self.nproc_per_node!r}")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be 0 or more, got {self.max_restarts}")
        if not self.monitor_interval > 0:
            raise UsageError(f"--monitor-interval must be a positive number of seconds, got {self.monitor_interval}")
        if self.start_method not in ("spawn", "fork", "forkserver"):
            raise UsageError(f"--start-method must be spawn, fork or forkserver, got {self.start_method!r}")
        if self.shutdown_timeout < 0:
            raise UsageError(f"--shutdown-timeout must be 0 or more seconds, got {self.shutdown_timeout}")
        if self.exit_barrier_timeout < 0:
            raise UsageError(f"--exit-barrier-timeout must be 0 or more seconds, got {self.exit_barrier_timeout}")
        if self.numa_fallback not in ("warn", "error"):
            raise UsageError(f"--numa-fallback must be warn or error, got {self.numa_fallback!r}")
        for spec, flag in ((self.redirects, "--redirects"), (self.tee, "--tee")):
            _check_std(spec, flag, self.nproc_per_node)
        signal_numbers(self.signals_to_handle)

    @property
    def signal_numbers(self) -> list[int]:
        return signal_numbers(self.signals_to_handle)


def _check_std(spec: StdSpec, flag: str, nproc: int) -> None:
    values = spec.values() if isinstance(spec, dict) else [spec]
    for value in values:
        if value not in (0, 1, 2, 3):
            raise UsageError(f"{flag} values must be 0, 1, 2 or 3, got {value!r}")
    if isinstance(spec, dict):
        for rank in spec:
            if not 0 <= rank < nproc:
                raise UsageError(f"{flag} names local rank {rank}, but ranks are 0..{nproc - 1}")


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
                f"--signals-to-handle: {raw.strip()!r} is not a signal the launcher can forward; "
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


def parse_nnodes(value: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX``."""
    parts = value.strip().split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise UsageError(f"--nnodes {value!r} is invalid: use N or MIN:MAX with integers, e.g. 2 or 1:4") from None
    if not 0 < low <= high:
        raise UsageError(f"--nnodes {value!r} is invalid: need 0 < MIN <= MAX, e.g. 2 or 1:4")
    return low, high


def parse_std(value: str, flag: str) -> StdSpec:
    """torchrun's Std format: ``3`` for every rank, or ``0:1,1:2`` per local rank."""
    text = value.strip()
    hint = f"{flag} {value!r} is invalid: use 0-3 for every rank, or LOCAL_RANK:0-3 pairs like 0:1,1:2"
    if text == "":
        return STD_NONE
    if ":" not in text:
        if text not in ("0", "1", "2", "3"):
            raise UsageError(hint)
        return int(text)
    mapping: dict[int, int] = {}
    for item in text.split(","):
        rank, sep, std = item.partition(":")
        if not sep or not rank.strip().isdigit() or std.strip() not in ("0", "1", "2", "3"):
            raise UsageError(hint)
        mapping[int(rank)] = int(std)
    return mapping


def parse_rdzv_conf(value: str) -> dict[str, str]:
    """``key1=value1,key2=value2``."""
    conf: dict[str, str] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--rdzv-conf item {item!r} is invalid: use key=value pairs, e.g. join_timeout=900")
        conf[key.strip()] = val.strip()
    return conf


def parse_ranks_filter(value: str) -> set[int] | None:
    text = value.strip()
    if not text:
        return None
    try:
        return {int(item) for item in text.split(",") if item.strip()}
    except ValueError:
        raise UsageError(
            f"--local-ranks-filter {value!r} is invalid: use a comma list of local ranks, e.g. 0,1,2"
        ) from None


def parse_filters(value: str | Sequence[str]) -> list[str]:
    """Comma list where ``,,`` stands for a literal comma."""
    if not isinstance(value, str):
        return list(value)
    placeholder = "\x00"
    items = value.replace(",,", placeholder).split(",")
    return [item.replace(placeholder, ",") for item in items if item]


def _number(value: Any, flag: str, kind: type = float) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError):
        noun = "an integer" if kind is int else "a number"
        raise UsageError(f"{flag} must be {noun}, got {value!r}") from None


def _switch(value: Any) -> bool:
    return bool(value)


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


def resolve_nproc(value: str, manager: LauncherPluginManager) -> tuple[int, DeviceProvider | None]:
    """An integer, or a device kind counted by its device-count provider."""
    text = value.strip()
    if text.lstrip("-").isdigit():  # the common case loads no device provider at all
        count = int(text)
        if count < 1:
            raise UsageError(f"--nproc-per-node must be at least 1, got {count}")
        return count, None
    from launcher.devices import resolve_nproc_per_node

    return resolve_nproc_per_node(value, manager)


def config_from_args(args: argparse.Namespace, manager: LauncherPluginManager,
                     environ: Mapping[str, str] | None = None) -> CommandLine:
    """Validate parsed flags and build the launch; raises :class:`UsageError`."""
    env = os.environ if environ is None else environ
    min_nodes, max_nodes = parse_nnodes(args.nnodes)

    if args.no_python and args.module:
        raise UsageError("--no-python and -m/--module cannot be used together: pick one")

    script: str = args.training_script
    script_args: list[str] = list(args.training_script_args)
    python = env.get("PYTHON_EXEC", sys.executable)
    run_path = None
    if args.run_path:
        path = os.path.abspath(script)
        if not os.path.isfile(path):
            raise UsageError(f"script {script!r} not found (--run-path needs a Python file)")
        command: list[str] = []
        run_path = (path, script_args)
    elif args.no_python:
        if os.sep in script:
            if not (os.path.isfile(script) and os.access(script, os.X_OK)):
                raise UsageError(f"program {script!r} not found or not executable (--no-python runs it directly)")
        elif _which(script) is None:
            raise UsageError(f"program {script!r} not found on PATH (--no-python runs it directly)")
        command = [script, *script_args]
    elif args.module:
        command = [python, "-u", "-m", script, *script_args]
    else:
        if not os.path.isfile(script):
            hint = " (use -m to run a module, or --no-python for a program)" if not script.endswith(".py") else ""
            raise UsageError(f"script {script!r} not found{hint}")
        command = [python, "-u", script, *script_args]

    nproc, provider = resolve_nproc(args.nproc_per_node, manager)

    rdzv_conf = parse_rdzv_conf(args.rdzv_conf)
    if args.standalone:
        backend, endpoint, run_id = "c10d", "localhost:0", new_run_id()
    else:
        backend, endpoint, run_id = args.rdzv_backend.strip().lower(), args.rdzv_endpoint, args.rdzv_id
    if backend == "static":
        node_rank = _number(args.node_rank, "--node-rank", int)
        if not 0 <= node_rank < max_nodes:
            raise UsageError(
                f"--node-rank {node_rank} is out of range: with --nnodes {args.nnodes} use 0..{max_nodes - 1}"
            )
        if min_nodes != max_nodes:
            raise UsageError(f"--nnodes {args.nnodes}: the static backend needs a fixed size; use c10d for MIN:MAX")
        rdzv_conf["rank"] = str(node_rank)
        if not endpoint:
            port = DEFAULT_MASTER_PORT if args.master_port is None else _number(args.master_port, "--master-port", int)
            if not 0 <= port <= 65535:
                raise UsageError(f"--master-port {port} is out of range 0..65535")
            host = args.master_addr.strip()
            if ":" in host and not host.startswith("["):
                host = f"[{host}]"
            endpoint = f"{host}:{port}"

    shutdown_timeout = args.shutdown_timeout
    if shutdown_timeout is None:
        shutdown_timeout = env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT)

    config = LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc,
        run_id=run_id,
        role=args.role,
        rdzv_endpoint=endpoint,
        rdzv_backend=backend,
        rdzv_configs=dict(rdzv_conf),
        max_restarts=_number(args.max_restarts, "--max-restarts", int),
        monitor_interval=_number(args.monitor_interval, "--monitor-interval"),
        start_method=args.start_method,
        log_dir=args.log_dir or None,
        redirects=parse_std(args.redirects, "--redirects"),
        tee=parse_std(args.tee, "--tee"),
        local_ranks_filter=parse_ranks_filter(args.local_ranks_filter),
        duplicate_stdout_filters=parse_filters(args.duplicate_stdout_filters),
        duplicate_stderr_filters=parse_filters(args.duplicate_stderr_filters),
        logs_specs=args.logs_specs,
        event_log_handlers=[n.strip() for n in args.event_log_handler.split(",") if n.strip()] or ["null"],
        local_addr=args.local_addr,
        signals_to_handle=[s for s in args.signals_to_handle.split(",") if s.strip()],
        shutdown_timeout=_number(shutdown_timeout, "--shutdown-timeout"),
        exit_barrier_timeout=_number(args.exit_barrier_timeout, "--exit-barrier-timeout"),
        virtual_local_rank=_switch(args.virtual_local_rank),
        device_kind=provider.name if provider is not None else None,
        numa_binding=args.numa_binding,
        numa_fallback=args.numa_fallback,
        log_line_prefix_template=env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
    )
    validate_plugins(config, manager)
    return CommandLine(config=config, command=command, run_path=run_path, device_provider=provider)


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
