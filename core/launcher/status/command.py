"""The ``launcher status PID|LOGDIR [--json] [--watch] [--interval SECONDS]`` command."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence

from launcher.status.render import render
from launcher.status.report import USAGE, JobNotRunning, job_status
from launcher.subcommand_args import take_seconds, take_switch, the_target

#: Seconds between two screens of ``--watch``, by default.
WATCH_INTERVAL = 2.0


def status_command(argv: Sequence[str]) -> int:
    """Print the status of the job ``argv`` names; 0 when it runs, 1 when it ended or never ran
    (:class:`~launcher.status.report.JobNotRunning`), 2 for bad input."""
    args = list(argv)
    as_json = take_switch(args, "--json")
    watch = take_switch(args, "--watch")
    interval = take_seconds(args, "--interval", WATCH_INTERVAL, "launcher status", USAGE)
    target = the_target(args, "launcher status", USAGE)
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


def _show(target: str, as_json: bool, *, clear: bool, watch: bool = True) -> None:
    status = job_status(target)
    text = json.dumps(status) + "\n" if as_json else render(status)
    if clear:  # on a terminal each screen replaces the last: cursor home, clear below
        text = "\x1b[H\x1b[J" + text
    elif watch and not as_json:  # elsewhere screens follow each other, one blank line apart
        text += "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
