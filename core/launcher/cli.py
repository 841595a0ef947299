"""The ``launcher`` command (and ``python -m launcher``).

``launcher [torchrun flags] script [args]`` runs a job; ``launcher plugins [--json]`` lists the
installed plugins. Invalid input ends with one line on stderr and exit status 2 before anything
starts; a failed job ends with a failure report and a non-zero status.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from launcher.console import setup_console_logging
from launcher.errors import LaunchError, UsageError
from launcher.values import one_line, quote

log = logging.getLogger("launcher")


def plugins_command(argv: Sequence[str]) -> int:
    """``launcher plugins [--json]``: every installed plugin and what it provides."""
    import json

    from launcher.plugins.manager import get_plugin_manager, registration_rows

    unknown = [arg for arg in argv if arg not in ("--json",)]
    if unknown:
        raise UsageError(f"launcher plugins: unknown argument {quote(unknown[0])}; usage: launcher plugins [--json]")
    manager = get_plugin_manager()
    rows: list[dict[str, Any]] = registration_rows(manager)
    if "--json" in argv:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("KIND", "NAME", "DESCRIPTION", "FROM", "LOADED")
    table: list[tuple[str, ...]] = [header]
    for row in rows:
        provider = f"{row['distribution'] or '?'} {row['version'] or ''}".strip()
        if row["group"] != "launcher":
            provider += f" [{row['group']}]"
        if row["loaded"]:
            name = row["name"] + (f" ({', '.join(row['aliases'])})" if row["aliases"] else "")
            table.append((row["kind"], name, row["description"], provider, "yes"))
        else:
            table.append(("-", row["plugin"], f"failed: {row['error']}", provider, "no"))
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header) - 1)]
    for line in table:
        cells = [str(cell).ljust(width) for cell, width in zip(line, widths, strict=False)]
        print("  ".join([*cells, str(line[-1])]).rstrip())
    return 0


def write_root_cause(report: Any, path: str) -> None:
    """Write the root cause to the launcher's own error file, as torchrun does.

    Set when something launched the launcher the way launcher launches workers (TorchX's local
    schedulers, an outer torchelastic agent): that parent then reports our root cause instead of
    a bare exit status. The format is the one ``@record`` writes.
    """
    import json

    root = report.root_cause
    message = root.summary() or f"worker rank {root.failure.rank} {root.exit_description()}"
    callstack = root.traceback or "\n".join(root.failure.stderr_tail)
    content = {
        "message": {
            "message": f"rank {root.failure.rank} on {root.failure.node}: {message}",
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(root.time))},
        }
    }
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(content, handle)
    except OSError as exc:
        log.warning("cannot write the error file %s: %s", path, exc)


def run(argv: Sequence[str]) -> int:
    """Run the command line ``argv`` (without the program name); the exit status."""
    from launcher.config import config_from_args
    from launcher.options import parse_args
    from launcher.plugins.manager import get_plugin_manager

    if list(argv[:1]) == ["plugins"]:
        return plugins_command(argv[1:])
    args = parse_args(argv)
    manager = get_plugin_manager()
    from launcher.clusters.apply import apply_cluster

    apply_cluster(args, manager)  # fills only the flags the command line left out
    command_line = config_from_args(args, manager)

    from launcher.agent.agent import Agent
    from launcher.agent.group import Entrypoint

    if command_line.run_path is not None:
        from launcher.run_path import run_script

        script, script_args = command_line.run_path
        entry = Entrypoint(function=run_script, args=(script, *script_args))
    else:
        entry = Entrypoint(command=command_line.command)
    agent = Agent(command_line.config, entry, manager, device_provider=command_line.device_provider)
    result = agent.run()
    if result.report is not None:
        sys.stderr.write(result.report.render().rstrip("\n") + "\n")
        if os.environ.get("TORCHELASTIC_ERROR_FILE"):
            write_root_cause(result.report, os.environ["TORCHELASTIC_ERROR_FILE"])
    elif result.message and result.exit_code != 0:
        log.error("%s", result.message)
    return result.exit_code


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point."""
    setup_console_logging()
    try:
        code = run(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        # one_line: a value with a line break or control character must not split the message.
        sys.stderr.write(f"launcher: error: {one_line(str(exc))}\n")
        code = exc.exit_code
    except LaunchError as exc:
        sys.stderr.write(f"launcher: {exc}\n")
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.exit(code)
