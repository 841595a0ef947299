"""The ``launcher`` command (and ``python -m launcher``).

``launcher [torchrun flags] script [args]`` runs a job; ``launcher plugins [--json]`` lists the
installed plugins; ``launcher stacks PID|LOGDIR`` prints a running job's stacks; ``launcher status
PID|LOGDIR`` shows its ranks; ``launcher bundle LOGDIR`` packs a failed job's evidence; ``launcher
alerts rules|dashboard`` prints the Prometheus alerting rules or the Grafana dashboard. Invalid input
ends with one line on stderr and exit status 2 before anything starts; a failed job ends with a
failure report and a non-zero status.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from launcher.console import setup_console_logging
from launcher.errors import LaunchError, UsageError
from launcher.values import one_line, quote

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from launcher.containment.watchdog import Watchdog
    from launcher.failures.report import FailureReport

log = logging.getLogger("launcher")


def plugins_command(argv: Sequence[str], autoload: bool | None = None) -> int:
    """``launcher plugins [--json]``: every installed plugin and what it provides."""
    import json

    from launcher.plugins.listing import registration_rows
    from launcher.plugins.manager import get_plugin_manager

    unknown = [arg for arg in argv if arg not in ("--json",)]
    if unknown:
        raise UsageError(f"launcher plugins: unknown argument {quote(unknown[0])}; usage: launcher plugins [--json]")
    rows = registration_rows(get_plugin_manager(autoload=autoload))
    if "--json" in argv:
        print(json.dumps([row.as_json() for row in rows], indent=2))
        return 0
    header = ("KIND", "NAME", "DESCRIPTION", "FROM", "LOADED")
    table: list[tuple[str, ...]] = [header]
    for row in rows:
        provider = f"{row.distribution or '?'} {row.version or ''}".strip()
        if row.group != "launcher":
            provider += f" [{row.group}]"
        if row.loaded and row.kind is not None and row.name is not None:
            name = row.name + (f" ({', '.join(row.aliases)})" if row.aliases else "")
            table.append((row.kind, name, row.description, provider, "yes"))
        else:
            table.append(("-", row.plugin, f"failed: {row.error}", provider, "no"))
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header) - 1)]
    for line in table:
        cells = [str(cell).ljust(width) for cell, width in zip(line, widths, strict=False)]
        print("  ".join([*cells, str(line[-1])]).rstrip())
    return 0


def write_root_cause(report: FailureReport, path: str) -> None:
    """Write the root cause to the launcher's own error file, as torchrun does.

    Set when something launched the launcher the way launcher launches workers (TorchX's local
    schedulers, an outer torchelastic agent): that parent then reports our root cause instead of
    a bare exit status. The format is the one ``@record`` writes.
    """
    try:
        report.write_error_file(path)
    except OSError as exc:
        log.warning("cannot write the error file %s: %s", path, exc)


def _spawn_watchdog() -> Watchdog:
    """The job's watchdog, its process started now (see :meth:`~launcher.containment.watchdog.Watchdog.spawn`)."""
    from launcher.containment.cgroups import warm_up
    from launcher.containment.watchdog import Watchdog

    warm_up()  # the kernel's wait before the agent can move into the job's cgroup, paid meanwhile
    watchdog = Watchdog(own_process=True)
    watchdog.spawn()
    return watchdog


def run(argv: Sequence[str]) -> int:
    """Run the command line ``argv`` (without the program name); the exit status.

    command line ─► every flag group's settings object (:func:`~launcher.command_line.read_command_line`,
    each value read and checked once, by its capability's settings module) ─►
    :class:`~launcher.plan.LaunchPlan` (built from those objects) ─► :class:`~launcher.agent.agent.Agent`:
    every problem with the input ends the first two steps (a :class:`UsageError`, exit status 2)
    before the agent starts anything. Only the watchdog's
    process runs by then (spawned early, see :meth:`~launcher.containment.watchdog.Watchdog.spawn`); it
    is ended at once.
    """
    from launcher.command_line import read_command_line
    from launcher.options import check_environment, flag_groups, parse_args
    from launcher.plugins.manager import get_plugin_manager

    autoload = check_environment(os.environ)
    if list(argv[:1]) == ["plugins"]:
        return plugins_command(argv[1:], autoload)
    if list(argv[:1]) == ["stacks"]:  # launcher stacks PID|LOGDIR: a running job's stacks
        from launcher.hangs.ondemand import stacks_command

        return stacks_command(argv[1:])
    if list(argv[:1]) == ["status"]:  # launcher status PID|LOGDIR: a running job's ranks (launcher.status)
        from launcher.status.command import status_command

        return status_command(argv[1:])
    if list(argv[:1]) == ["bundle"]:  # launcher bundle LOGDIR: a failed job's evidence in one archive
        from launcher.status.bundle import bundle_command

        return bundle_command(argv[1:])
    if list(argv[:1]) == ["alerts"]:  # launcher alerts rules|dashboard: Prometheus rules, Grafana dashboard
        from launcher.status.alerts import alerts_command

        return alerts_command(list(argv[1:]))
    # The watchdog's interpreter boots on the core the agent leaves idle while it loads the
    # plugins (which may add flags, so they come before the command line is read) and builds its
    # plan. Not for --help or --version, which start nothing.
    watchdog: Watchdog | None = None
    try:
        if not any(arg in ("-h", "--help", "--version") for arg in argv):
            watchdog = _spawn_watchdog()
        manager = get_plugin_manager(autoload=autoload)
        groups = flag_groups(manager)
        args = parse_args(argv, groups)
        if watchdog is None:  # "--help" was only a script's argument: the usual start after all
            watchdog = _spawn_watchdog()
        from launcher.clusters.apply import apply_cluster

        apply_cluster(args, manager)  # fills only the flags the command line left out
        plan = read_command_line(args, manager, groups=groups).plan(manager)
        from launcher.agent.agent import Agent

        # The agent may contain its job in this process's cgroup; it starts and stops the watchdog.
        result = Agent(plan, own_process=True, watchdog=watchdog).run()
    finally:
        if watchdog is not None:
            watchdog.dismiss()  # only if the agent never started it (refused input): nothing to watch
    if result.report is not None:
        sys.stderr.write(result.report.render().rstrip("\n") + "\n")
        if os.environ.get("TORCHELASTIC_ERROR_FILE"):
            write_root_cause(result.report, os.environ["TORCHELASTIC_ERROR_FILE"])
    elif result.message and result.exit_code != 0 and not result.preempted:  # a preemption's report is said
        log.error("%s", result.message)
    return result.exit_code


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point."""
    setup_console_logging()
    try:
        code = run(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        # one_line: a value with a line break or control character must not split the message.
        _write_stderr(f"launcher: error: {one_line(str(exc))}\n")
        code = exc.exit_code
    except LaunchError as exc:
        _write_stderr(f"launcher: {exc}\n")
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    with contextlib.suppress(AttributeError, OSError, ValueError):  # stdout full or closed
        sys.stdout.flush()
    sys.exit(code)


def _write_stderr(text: str) -> None:
    """Write ``text`` to stderr; a full, closed or missing stderr (``2>/dev/full``, ``2>&-``) must
    not turn the exit status into another one (a usage error is 2 whether or not it could be said)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.write(text)
        sys.stderr.flush()
