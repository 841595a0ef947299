"""From the parsed command line to a :class:`~launcher.config.LaunchConfig` and the workers' command.

:mod:`launcher.options` reads the flags as text; :func:`config_from_args` checks every value (naming
the flag or the ``PET_*`` variable it came from) and counts ``--nproc-per-node`` when it names a
device kind. Every problem is a :class:`~launcher.errors.UsageError`: one line, exit status 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.config import (
    DEFAULT_MASTER_PORT,
    DEFAULT_SHUTDOWN_TIMEOUT,
    MAX_MONITOR_INTERVAL,
    LaunchConfig,
    StdSpec,
    check_std,
    new_run_id,
    parse_filters,
    parse_nnodes,
    parse_ranks_filter,
    parse_rdzv_conf,
    parse_std,
)
from launcher.errors import UsageError
from launcher.rendezvous.endpoint import check_host, format_endpoint
from launcher.values import MAX_NPROC, MAX_RESTARTS, parse_int, parse_seconds, quote

if TYPE_CHECKING:  # pragma: no cover
    import argparse

    from launcher.agent.group import Entrypoint
    from launcher.plugins.manager import LauncherPluginManager
    from launcher.plugins.types import DeviceProvider


def _which(program: str) -> str | None:
    import shutil  # here: shutil costs every launch milliseconds before its first worker starts

    return shutil.which(program)


@dataclass
class CommandLine:
    """What the CLI runs: the validated config and each worker's command."""

    config: LaunchConfig
    #: argv of the worker command (``${local_rank}`` substituted per worker); empty for run-path.
    command: list[str]
    #: For ``--run-path``: the script run in-process with runpy, and its arguments.
    run_path: tuple[str, list[str]] | None = None
    #: The provider that counted ``--nproc-per-node`` when it named a device kind.
    device_provider: DeviceProvider | None = None

    def entrypoint(self) -> Entrypoint:
        """What every worker runs: the command, or for ``--run-path`` the script run in-process."""
        from launcher.agent.group import Entrypoint

        if self.run_path is not None:
            from launcher.run_path import run_script

            script, script_args = self.run_path
            return Entrypoint(function=run_script, args=(script, *script_args))
        return Entrypoint(command=self.command)


def resolve_nproc(value: str, manager: LauncherPluginManager,
                  name: str = "--nproc-per-node") -> tuple[int, DeviceProvider | None]:
    """An integer from 1 to :data:`~launcher.values.MAX_NPROC`, or a device kind counted by its provider."""
    # A device kind's name starts with a letter ("cuda", "gaudi2"); anything else ("1e3", "-2",
    # "٣", "²", "1_0", "+2", " 2", "") is a count, read as plain ASCII decimal like every number.
    if not value[:1].isalpha():
        return parse_int(value, name, 1, MAX_NPROC), None  # the common case loads no provider
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


def _preload(args: argparse.Namespace, name: str) -> tuple[str, ...]:
    if not args.preload:  # the usual case: the preloading machinery is not even imported
        return ()
    from launcher.agent.preload import preload_for_command

    return preload_for_command(args.preload, no_python=bool(args.no_python), name=name)


def config_from_args(args: argparse.Namespace, manager: LauncherPluginManager,
                     environ: Mapping[str, str] | None = None) -> CommandLine:
    """Validate parsed flags and build the launch's config; raises :class:`UsageError`.

    Messages name where a value came from: the flag, or its ``PET_*`` variable. The plugins the
    config names (beyond the device kind ``--nproc-per-node`` counts) are resolved afterwards,
    by :func:`launcher.plan.build_plan`.
    """
    from launcher.hangs.settings import parse_hang_timeout
    from launcher.options import source_name

    def name(dest: str) -> str:
        return source_name(args, dest)

    env = os.environ if environ is None else environ
    min_nodes, max_nodes = parse_nnodes(args.nnodes, name("nnodes"))
    command, run_path = _worker_command(args, env)
    nproc, provider = resolve_nproc(args.nproc_per_node, manager, name("nproc_per_node"))

    rdzv_conf = parse_rdzv_conf(args.rdzv_conf)
    if args.standalone and max_nodes > 1:
        raise UsageError(
            f"{name('nnodes')} {quote(args.nnodes)} with --standalone: a standalone job is one node; drop "
            "--standalone and give --rdzv-backend c10d --rdzv-endpoint HOST:PORT for several nodes"
        )
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
        event_log_handlers=_names(args.event_log_handler, name("event_log_handler"), "event handler", "null,console"),
        local_addr=args.local_addr,
        signals_to_handle=args.signals_to_handle.split(","),  # empty items refused by the config
        shutdown_timeout=parse_seconds(shutdown_timeout, shutdown_name),
        exit_barrier_timeout=parse_seconds(args.exit_barrier_timeout, name("exit_barrier_timeout")),
        virtual_local_rank=bool(args.virtual_local_rank),
        numa_binding=args.numa_binding,
        numa_fallback=args.numa_fallback,
        log_line_prefix_template=env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
        worker_tty=args.worker_tty.strip().lower(),
        hang_timeout=parse_hang_timeout(args.hang_timeout, name("hang_timeout")),
        hang_watch=args.hang_watch,
        preload=_preload(args, name("preload")),
        # -- health checks (issue 26, launcher.health) --
        health_checks=_health_checks(args.health_checks, name("health_checks")),
        health_check_cmd=_health_check_cmd(args.health_check_cmd, name("health_check_cmd")),
        # -- preemption (issue 29, launcher.preemption) --
        **_preemption(args.preemption_signals, args.preemption_grace, bool(args.requeue), name),
    )
    return CommandLine(config=config, command=command, run_path=run_path, device_provider=provider)


# -- health checks (issue 26, launcher.health) --
def _health_checks(value: str | None, flag: str) -> tuple[str, ...] | None:
    from launcher.health.settings import parse_health_checks

    return parse_health_checks(value, flag)


def _health_check_cmd(value: str | None, flag: str) -> str | None:
    from launcher.health.settings import parse_health_check_cmd

    return parse_health_check_cmd(value, flag)
# -- end health checks --


# -- preemption (issue 29, launcher.preemption) --
def _preemption(signals: str | None, grace: str | None, requeue: bool, name: Callable[[str], str]) -> dict[str, Any]:
    """The config's preemption fields, checked here so that a message names the flag or its
    ``PET_*`` variable; the module is not even imported when none is given."""
    if signals is None and grace is None and not requeue:
        return {}
    from launcher.preemption.settings import parse_preemption_grace, parse_preemption_signals

    parse_preemption_signals(signals, name("preemption_signals"))
    return {"preemption_signals": signals, "preemption_grace": parse_preemption_grace(grace, name("preemption_grace")),
            "preemption_requeue": requeue}
# -- end preemption --


def _names(value: str, flag: str, kind: str, example: str) -> list[str]:
    """A comma list of plugin names; an empty list or an empty item is refused, not skipped."""
    names = [item.strip() for item in value.split(",")]
    if not all(names):
        what = "names no" if not any(names) else "has an empty"
        raise UsageError(f"{flag} {quote(value)} {what} {kind} name: give names like {example}")
    return names


def _std_for(spec: StdSpec, flag: str, nproc: int) -> StdSpec:
    """``spec`` after checking its local ranks against this node's worker count."""
    check_std(spec, flag, nproc)
    return spec
