"""The ``launcher status PID|LOGDIR [--json] [--watch] [--interval SECONDS]`` command."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence

from launcher.errors import UsageError
from launcher.status.render import render
from launcher.status.report import USAGE, JobNotRunning, job_status
from launcher.values import parse_seconds, quote

#: Seconds between two screens of ``--watch``, by default.
WATCH_INTERVAL = 2.0


def status_command(argv: Sequence[str]) -> int:
    """Print the status of the job ``argv`` names; 0 when it runs, 1 when it ended or never ran
    (:class:`~launcher.status.report.JobNotRunning`), 2 for bad input."""
    args = list(argv)
    as_json = _flag(args, "--json")
    watch = _flag(args, "--watch")
    interval = WATCH_INTERVAL
    if "--interval" in args:
        at = args.index("--interval")
        if at + 1 >= len(args):
            raise UsageError(f"launcher status: --interval needs a number of seconds; {USAGE}")
        interval = parse_seconds(args[at + 1], "launcher status --interval", zero=False)
        del args[at : at + 2]
    if len(args) != 1 or args[0].startswith("-"):
        extra = args[1] if len(args) > 1 and not args[0].startswith("-") else (args[0] if args else None)
        what = f"unknown argument {quote(extra)}; " if extra is not None else ""
        raise UsageError(f"launcher status: {what}{USAGE}")
    target = args[0]
    if not watch:
        _show(target, as_json, clear=False, watch=False)
        return 0
    clear = not as_json and sys.stdout.isatty()
    try:
        while True:
            _show(target, as_json, clear=clear)
            time.sleep(interval)
    except JobNotRunning as exc:  # the job ended while watched: say so, as the last screen
        print(f"launcher: {exc}", flush=True)
        return 0
    except KeyboardInterrupt:
        return 0


def _flag(args: list[str], name: str) -> bool:
    if name in args:
        args[:] = [arg for arg in args if arg != name]
        return True
    return False


def _show(target: str, as_json: bool, *, clear: bool, watch: bool = True) -> None:
    status = job_status(target)
    text = json.dumps(status) + "\n" if as_json else render(status)
    if clear:  # on a terminal each screen replaces the last: cursor home, clear below
        text = "\x1b[H\x1b[J" + text
    elif watch and not as_json:  # elsewhere screens follow each other, one blank line apart
        text += "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
