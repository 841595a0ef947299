"""The launcher's own messages on stderr, in one format for the command line and the Python API.

``[launcher] WARNING: setting OMP_NUM_THREADS=1 ...`` reads the same whether the job was started
by ``launcher`` or by :func:`launcher.api.launch`: both install :func:`setup_console_logging`
(the API only when the application has not configured logging itself).
"""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "[launcher] %(levelname)s: %(message)s"

#: What ``LOGLEVEL`` may say (any case): logging's level names, as torch's own loggers read it.
LOG_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
    "FATAL": logging.CRITICAL,
    "NOTSET": logging.NOTSET,
}


class ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """Writes the launcher's messages under the console lock the output pump uses."""

    def emit(self, record: logging.LogRecord) -> None:
        from launcher.logs.pump import CONSOLE_LOCK

        with CONSOLE_LOCK:
            super().emit(record)


def setup_console_logging() -> None:
    """Send the ``launcher`` logger to stderr in the launcher's format; ``LOGLEVEL`` sets the level."""
    # The command line refuses any other value (launcher.options.check_environment); the Python
    # API, which must not fail on its host application's environment, uses the default.
    level = LOG_LEVELS.get(os.environ.get("LOGLEVEL", "").strip().upper(), logging.WARNING)
    handler = ConsoleHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger("launcher")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    if not os.environ.get("LOGLEVEL", "").strip():  # unset or empty: the default
        # Waiting for other nodes should never look like a hang: show the rendezvous' progress
        # ("2 joined of min 3 ...; timeout in 540 s") by default.
        logging.getLogger("launcher.rendezvous").setLevel(logging.INFO)
        # --hang-timeout auto: each change of a learned timeout (a few per job) is worth a line.
        logging.getLogger("launcher.hangs.learned").setLevel(logging.INFO)


def ensure_console_logging() -> None:
    """:func:`setup_console_logging`, unless the application already configured logging."""
    if logging.getLogger("launcher").handlers or logging.getLogger().handlers:
        return
    setup_console_logging()
