"""The ``launcher status PID|LOGDIR [--json] [--watch] [--interval SECONDS]`` command, and
``launcher status --rdzv-endpoint HOST:PORT --rdzv-id ID [--rdzv-backend NAME] [--rdzv-conf K=V,...]``
(the job's own rendezvous flags, or their ``PET_`` variables) from any host."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from launcher.errors import UsageError
from launcher.status.render import render
from launcher.status.report import USAGE, JobNotRunning, job_status, resolve_agent
from launcher.subcommand_args import take_seconds, take_switch, take_value, the_target
from launcher.values import quote

#: The rendezvous flags ``launcher status`` takes, with the variable each falls back to (as the job's own).
RDZV_FLAGS = {"--rdzv-endpoint": "PET_RDZV_ENDPOINT", "--rdzv-id": "PET_RDZV_ID",
              "--rdzv-backend": "PET_RDZV_BACKEND", "--rdzv-conf": "PET_RDZV_CONF"}

#: Seconds between two screens of ``--watch``, by default.
WATCH_INTERVAL = 2.0


def status_command(argv: Sequence[str]) -> int:
    """Print the status of the job ``argv`` names; 0 when it runs, 1 when it ended or never ran
    (:class:`~launcher.status.report.JobNotRunning`), 2 for bad input."""
    args = list(argv)
    as_json = take_switch(args, "--json")
    watch = take_switch(args, "--watch")
    interval = take_seconds(args, "--interval", WATCH_INTERVAL, "launcher status", USAGE)
    read = _rendezvous_reader(args, os.environ)
    if read is None:
        target, note = resolve_agent(the_target(args, "launcher status", USAGE))
        if note:  # a wrapper's pid (timeout, srun, a shell): say whose status this is
            print(f"launcher: {note}", file=sys.stderr, flush=True)

        def read() -> dict[str, Any]:
            return job_status(target)
    elif args:
        raise UsageError(f"launcher status: unknown argument {quote(args[0])} (a job named by its rendezvous "
                         f"takes no PID or LOGDIR); {USAGE}")
    if not watch:
        _show(read, as_json, clear=False, watch=False)
        return 0
    clear = not as_json and sys.stdout.isatty()
    try:
        while True:
            _show(read, as_json, clear=clear)
            time.sleep(interval)
    except JobNotRunning as exc:  # the job ended while watched: say so, as the last screen
        print(f"launcher: {exc}", flush=True)
        return 0
    except KeyboardInterrupt:
        return 0


def _rendezvous_reader(args: list[str], environ: Mapping[str, str]) -> Callable[[], dict[str, Any]] | None:
    """The reader of the job the ``--rdzv-*`` flags (else their ``PET_`` variables) name; ``None``
    when neither the flags nor a target-less command line ask for one."""
    given = {flag: take_value(args, flag, "launcher status", USAGE, "a value") for flag in RDZV_FLAGS}
    if not any(value is not None for value in given.values()) and (args or not environ.get("PET_RDZV_ENDPOINT")):
        return None  # a PID or LOGDIR (or the usage line)
    values = {flag: value if value is not None else environ.get(variable, "")
              for (flag, variable), value in zip(RDZV_FLAGS.items(), given.values(), strict=True)}
    for flag in ("--rdzv-endpoint", "--rdzv-id"):
        if not values[flag].strip():
            raise UsageError(f"launcher status: {flag} (or {RDZV_FLAGS[flag]}) is needed to read a job through its "
                             f"rendezvous; give the job's own; {USAGE}")
    from launcher.rendezvous.api import RendezvousParameters
    from launcher.status.remote import parse_conf, rendezvous_status

    params = RendezvousParameters(backend=values["--rdzv-backend"].strip() or "c10d",
                                  endpoint=values["--rdzv-endpoint"].strip(), run_id=values["--rdzv-id"].strip(),
                                  min_nodes=1, max_nodes=1, config=parse_conf(values["--rdzv-conf"]))
    return lambda: rendezvous_status(params, environ)


def _show(read: Callable[[], dict[str, Any]], as_json: bool, *, clear: bool, watch: bool = True) -> None:
    status = read()
    text = json.dumps(status) + "\n" if as_json else render(status)
    if clear:  # on a terminal each screen replaces the last: cursor home, clear below
        text = "\x1b[H\x1b[J" + text
    elif watch and not as_json:  # elsewhere screens follow each other, one blank line apart
        text += "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
