"""Pseudo-terminals for workers, so that progress bars and colours work as under torchrun.

torchrun lets its workers inherit its terminal; the launcher reads every worker stream itself
(prefixes, tee, filters, failure reports), so a worker writing to a pipe would see
``isatty() == False`` and its libraries would fall back to plain output. With ``--worker-tty``
(``auto`` by default: when the launcher's own stdout/stderr is a terminal) each such stream is a
pseudo-terminal instead: the worker sees a terminal, the agent reads the master side.

Choices made here, and why:

* **One pty per stream** (two per worker). A pty carries a single byte stream: one pty for
  stdout and stderr would merge them, and ``stdout.log``/``stderr.log``, the stderr tail of a
  failure report and a launcher whose ``2>`` goes elsewhere all need them apart.
* **Raw output** (``OPOST`` off): the line discipline would otherwise turn ``\\n`` into
  ``\\r\\n``, and log files must hold the bytes the worker wrote.
* **No controlling terminal.** The worker's new session does not adopt the pty: a program that
  opens ``/dev/tty`` to prompt (``getpass``) fails over to stdin as it does under torchrun,
  instead of waiting forever for input nobody can type. Window changes are therefore signalled by
  the agent itself: on its own ``SIGWINCH`` it sets the new size on every worker pty and sends
  ``SIGWINCH`` to the worker's process group.
* **The size the worker sees** is the launcher's terminal less the width of the console prefix
  (``[default0]:``), so that a bar drawn to the full width does not wrap on the real screen.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import struct
import termios
import threading
from typing import Any

#: Values of ``--worker-tty``.
TTY_MODES = ("auto", "always", "never")

#: Window size given when the launcher itself has no terminal to copy (``--worker-tty always``).
DEFAULT_SIZE = (24, 80)

_WINSIZE = "HHHH"


def stream_wants_terminal(mode: str, console_fd: int | None) -> bool:
    """Whether a worker stream gets a pty: ``always``, or ``auto`` and it reaches a terminal console."""
    if mode == "always":
        return True
    if mode != "auto" or console_fd is None:
        return False
    try:
        return os.isatty(console_fd)
    except OSError:
        return False


def launcher_window_size() -> tuple[int, int, int, int]:
    """The launcher's terminal size as (rows, columns, x pixels, y pixels), or a default."""
    for fd in (1, 2, 0):
        with contextlib.suppress(OSError):
            rows, cols, xpix, ypix = struct.unpack(
                _WINSIZE, fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * struct.calcsize(_WINSIZE))
            )
            if rows and cols:
                return rows, cols, xpix, ypix
    return DEFAULT_SIZE[0], DEFAULT_SIZE[1], 0, 0


def _set_size(fd: int, size: tuple[int, int, int, int]) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack(_WINSIZE, *size))


def _prefix_width(prefix: bytes) -> int:
    return len(prefix.decode("utf-8", "replace"))


class _Terminal:
    """One worker pty as the agent keeps it: its own handle on the master, and who to signal."""

    def __init__(self, master: int, prefix_width: int) -> None:
        # A duplicate, closed only by WorkerTerminals.close: the pump closes its own master fd
        # at end of stream, and a resize must never act on a descriptor number reused since.
        self.master = os.dup(master)
        self.prefix_width = prefix_width
        self.pid: int | None = None
        self.size: tuple[int, int, int, int] | None = None

    def apply(self, screen: tuple[int, int, int, int]) -> bool:
        """Set the worker's size from the launcher's; whether it changed."""
        rows, cols, xpix, ypix = screen
        size = (rows, max(1, cols - self.prefix_width), xpix, ypix)
        if size == self.size:
            return False
        with contextlib.suppress(OSError):
            _set_size(self.master, size)
            self.size = size
            return True
        return False


class WorkerTerminals:
    """The ptys of one worker group, kept at the launcher's window size."""

    def __init__(self) -> None:
        self._terminals: list[_Terminal] = []
        self._lock = threading.Lock()
        self._previous_handler: Any = None
        self._handler_installed = False

    def open(self, prefix: bytes) -> tuple[int, int]:
        """A new pty for one worker stream: ``(master, slave)``, both close-on-exec.

        The slave goes to the worker as its stdout or stderr (and is closed here once the worker
        has it); the master goes to the output pump.
        """
        master, slave = os.openpty()
        try:
            attrs = termios.tcgetattr(slave)
            # Output exactly as written: no \n -> \r\n, no tab expansion; nobody types input.
            attrs[1] &= ~termios.OPOST
            attrs[3] &= ~(termios.ECHO | termios.ICANON | termios.ISIG | termios.IEXTEN)
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            terminal = _Terminal(master, _prefix_width(prefix))
            terminal.apply(launcher_window_size())
        except BaseException:
            os.close(master)
            os.close(slave)
            raise
        with self._lock:
            self._terminals.append(terminal)
        self._install_handler()
        return master, slave

    def attach(self, pid: int) -> None:
        """Note the worker (its process group) that the ptys opened since the last call went to."""
        with self._lock:
            for terminal in self._terminals:
                if terminal.pid is None:
                    terminal.pid = pid

    def resize(self) -> None:
        """Follow the launcher's window: new size on every pty, SIGWINCH to workers it changed."""
        screen = launcher_window_size()
        with self._lock:
            terminals = list(self._terminals)
        signalled: set[int] = set()
        for terminal in terminals:
            if terminal.apply(screen) and terminal.pid is not None and terminal.pid not in signalled:
                signalled.add(terminal.pid)
                with contextlib.suppress(OSError):
                    os.killpg(terminal.pid, signal.SIGWINCH)

    def _install_handler(self) -> None:
        if self._handler_installed or threading.current_thread() is not threading.main_thread():
            return  # off the main thread no handler can be set: sizes stay as they started
        with contextlib.suppress(OSError, ValueError):
            self._previous_handler = signal.signal(signal.SIGWINCH, self._on_sigwinch)
            self._handler_installed = True

    def _on_sigwinch(self, signum: int, frame: Any) -> None:
        self.resize()
        previous = self._previous_handler
        if callable(previous):
            previous(signum, frame)

    def close(self) -> None:
        """Restore the previous SIGWINCH handler and release the ptys' master handles."""
        if self._handler_installed:
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(signal.SIGWINCH, self._previous_handler)
            self._handler_installed = False
        with self._lock:
            terminals, self._terminals = self._terminals, []
        for terminal in terminals:
            with contextlib.suppress(OSError):
                os.close(terminal.master)
