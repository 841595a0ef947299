"""The validated description of a launch: :class:`LaunchConfig` and the readers of its values.

:class:`LaunchConfig` is both the Python API's input and what the CLI builds from its flags
(:mod:`launcher.command_line`), so the two paths validate values the same way. This module checks
values only; the plugins a config names are resolved, and the machine checked, when the launch
plan is built (:func:`launcher.plan.build_plan`). Every problem is a
:class:`~launcher.errors.UsageError` with one line that says what is wrong and what would be right.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.errors import UsageError
from launcher.values import (
    MAX_NODES,
    MAX_NPROC,
    MAX_RESTARTS,
    parse_int,
    parse_seconds,
    quote,
    read_int,
)

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
    #: ``--preload``: modules a per-node template imports once, workers forked from it (launcher.agent.preload).
    preload: tuple[str, ...] = ()
    # -- health checks (issue 26, launcher.health) --
    #: ``--health-checks``: check names, ``"none"``, or ``None`` for the default checks.
    health_checks: str | Sequence[str] | None = None
    #: ``--health-check-cmd``: the site's health command (``None``: none).
    health_check_cmd: str | None = None
    # -- end health checks --
    # -- preemption (issue 29, launcher.preemption) --
    #: ``--preemption-signals``: the signals that mean preemption (``None``: SIGTERM once preemption is on).
    preemption_signals: str | Sequence[str] | None = None
    #: ``--preemption-grace``: seconds to save and exit once preempted (``None``: ``shutdown_timeout``).
    preemption_grace: float | None = None
    #: ``--requeue``: under Slurm, requeue the job after a preemption's save.
    preemption_requeue: bool = False
    # -- end preemption --

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
            check_std(spec, flag, self.nproc_per_node)
        if self.local_ranks_filter is not None:
            for rank in self.local_ranks_filter:
                parse_int(rank, "--local-ranks-filter rank", 0, self.nproc_per_node - 1)
        if isinstance(self.signals_to_handle, str):  # the command line's form, "SIGTERM,SIGINT"
            self.signals_to_handle = self.signals_to_handle.split(",")
        signal_numbers(self.signals_to_handle)
        from launcher.hangs.settings import parse_hang_timeout, parse_hang_watch

        self.hang_timeout = parse_hang_timeout(self.hang_timeout)
        self.hang_watch = parse_hang_watch(self.hang_watch)
        from launcher.health.settings import check_health_config  # health checks (issue 26)

        check_health_config(self)
        if self.preemption_signals is not None or self.preemption_grace is not None or self.preemption_requeue:
            from launcher.preemption.settings import check_preemption_config

            check_preemption_config(self)
        if self.preload:  # --preload; its machinery is imported only when asked for
            from launcher.agent.preload import parse_preload

            self.preload = parse_preload(self.preload)
        else:
            self.preload = ()

    @property
    def signal_numbers(self) -> list[int]:
        return signal_numbers(self.signals_to_handle)


def check_std(spec: StdSpec, flag: str, nproc: int) -> None:
    """``--redirects``/``--tee`` values are 0-3, keyed (if at all) by local ranks below ``nproc``."""
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


def new_run_id() -> str:
    """A random job id (what ``uuid.uuid4().hex`` gives, without importing uuid)."""
    return os.urandom(16).hex()


# -- parsing of individual flag values ----------------------------------------------------------


def parse_nnodes(value: str, name: str = "--nnodes") -> tuple[int, int]:
    """``N`` or ``MIN:MAX``, each an integer from 1 to :data:`~launcher.values.MAX_NODES`."""
    parts = value.split(":")  # plain ASCII decimal: no spaces, as every number
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
    text = value
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
        if not sep or rank is None or std not in ("0", "1", "2", "3"):
            raise UsageError(hint)
        if rank in mapping:
            raise UsageError(f"{flag} {quote(value)} names local rank {rank} twice")
        mapping[rank] = int(std)
    return mapping


_QUOTES = "'\""


def _check_stray_quotes(value: str) -> None:
    """Refuse a value that still carries the quotes of a quoting layer that did not remove them.

    ``--rdzv-conf='join_timeout=5,timeout=5'`` quoted once more (in a YAML command list, a script
    that quotes its arguments) arrives with the quotes in it. torchrun then silently ignores the
    mangled keys; here it is refused, with the value as it was meant. Keys never hold quotes, and
    a value is never wrapped in them.
    """
    for item in value.split(","):
        key, _, val = item.strip().partition("=")
        val = val.strip()
        if any(mark in key for mark in _QUOTES) or (val and (val[0] in _QUOTES or val[-1] in _QUOTES)):
            unquoted = value.translate({ord(mark): None for mark in _QUOTES})
            raise UsageError(
                f"--rdzv-conf {quote(value)} carries quote characters (a quoting layer passed them on): "
                f"give it without them, --rdzv-conf {unquoted}"
            )


def parse_rdzv_conf(value: str) -> dict[str, str]:
    """``key1=value1,key2=value2``; an empty value is an error (it would silently mean the default)."""
    _check_stray_quotes(value)
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
        if key.strip() in conf:
            raise UsageError(f"--rdzv-conf gives {quote(key.strip())} twice: give each key once")
        conf[key.strip()] = val.strip()
    return conf


def parse_ranks_filter(value: str, name: str = "--local-ranks-filter") -> set[int] | None:
    """Comma list of local ranks (``0,2``); empty means every rank."""
    text = value
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
