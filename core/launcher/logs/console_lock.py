"""The agent's console: one lock for every write to its stdout/stderr, and writes that go out whole.

The output pump and the launcher's own log messages both write to descriptors 1 and 2. Holding
:data:`CONSOLE_LOCK` around each write keeps a launcher message from landing inside a worker's
line, and takes a live worker line (a progress bar on a terminal) out of the way meanwhile.
"""

from __future__ import annotations

import os
import selectors
import sys
import threading

from launcher.logs.screen import Screen

__all__ = ["CONSOLE_LOCK", "ConsoleLock", "console_fd", "write_all"]


class ConsoleLock:
    """Held for every write to the agent's own stdout/stderr, by the pump and by the agent's log
    messages alike, so a launcher message never lands inside a worker's line.

    Entering it (``with CONSOLE_LOCK:``) also takes a live worker line (a progress bar) off each
    terminal for the time of the message and draws it again after it. The pump itself holds
    :attr:`lock`, the plain lock, and manages the screens itself.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: The terminals live worker output is shown on, by device.
        self.screens: dict[int, Screen] = {}

    def __enter__(self) -> ConsoleLock:
        self.lock.acquire()
        for screen in self.screens.values():
            write_all(screen.fd, screen.hide())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for screen in self.screens.values():
                write_all(screen.fd, screen.show())
        finally:
            self.lock.release()

    def screen(self, fd: int) -> Screen:
        """The screen of the terminal ``fd`` writes to (one for stdout and stderr on the same one)."""
        try:
            device = os.fstat(fd).st_rdev
        except OSError:
            device = -fd - 1
        found = self.screens.get(device)
        if found is None:
            found = self.screens[device] = Screen(fd)
        return found


#: The console lock (see :class:`ConsoleLock`).
CONSOLE_LOCK = ConsoleLock()


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, waiting out a descriptor someone made non-blocking; a
    console that went away swallows the rest silently (files still get every line)."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            # Someone made our console non-blocking; wait until it takes more.
            with selectors.DefaultSelector() as selector:
                selector.register(fd, selectors.EVENT_WRITE)
                selector.select(0.1)
            continue
        except InterruptedError:
            continue
        except OSError:
            return  # the console went away; files still get every line
        view = view[written:]


def console_fd(stream: str) -> int:
    """The agent's own stdout (``"out"``) or stderr descriptor."""
    return (sys.stdout if stream == "out" else sys.stderr).fileno()
