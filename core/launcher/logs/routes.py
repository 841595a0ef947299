"""Where one worker stream goes, and the state of one stream while the pump reads it.

A :class:`StreamRoute` is what the agent asks for (console, log file, filtered file, sink, tail);
a :class:`PumpedStream` is the pump's record of one open pipe: its unfinished line, its tail, and
the destinations still working (a failing one is dropped). :func:`open_log` opens a destination.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from launcher.logs.lines import LineBuffer
from launcher.logs.sink import SinkDestination, SinkWriter

__all__ = ["PIPE_SIZE", "PumpedStream", "StreamRoute", "enlarge_pipe", "open_log"]

#: Pipe capacity asked for (Linux ``F_SETPIPE_SZ``); within the unprivileged 1 MiB maximum, and
#: small enough that many workers stay within the per-user pipe memory quota.
PIPE_SIZE = 1 << 18

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def open_log(path: str) -> BinaryIO:
    """Open a destination for appending: a file readable by its owner only (mode 0600).

    A :class:`~launcher.logs.sink.SinkDestination` opens its sink instead (the returned object
    is then a :class:`~launcher.logs.sink.SinkWriter`, which the pump feeds whole lines).
    """
    if isinstance(path, SinkDestination):
        writer: Any = SinkWriter(path)
        return writer
    return open(path, "ab", buffering=1 << 16, opener=_private_opener)


def _private_opener(path: str, flags: int) -> int:
    # Worker output often holds tokens and host names: other users must not read it.
    return os.open(path, flags | os.O_CLOEXEC, 0o600)


def enlarge_pipe(fd: int) -> None:
    """Ask for a :data:`PIPE_SIZE` pipe buffer, so a reader wakes less often per line."""
    # Best effort: Linux only, and refused once the user's pipe quota is used up.
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)


@dataclass
class StreamRoute:
    """Where one worker stream goes."""

    #: Prefix added to every console line (``b""`` for none).
    prefix: bytes = b""
    #: The console file descriptor (1 or 2), or ``None`` to keep it off the console.
    console_fd: int | None = None
    #: Log file (from :func:`open_log`), or ``None``.
    file: BinaryIO | None = None
    #: Lines containing any of these also go to ``filtered_file``.
    filters: Sequence[bytes] = ()
    filtered_file: BinaryIO | None = None
    #: Keep the last :data:`~launcher.logs.lines.TAIL_BYTES` for failure reports.
    keep_tail: bool = False
    #: Show console output as it arrives, unfinished lines included (a worker pty on a terminal
    #: console); otherwise the console gets whole lines.
    live: bool = False
    #: Called (on the pump thread) whenever the stream carried output: hang watching by output.
    on_output: Callable[[], None] | None = None


@dataclass
class PumpedStream:
    """One pipe being read, and its state (returned by :meth:`OutputPump.add`)."""

    fd: int
    route: StreamRoute
    #: The unfinished line, held back from the line-wise destinations.
    lines: LineBuffer = field(default_factory=LineBuffer)
    tail: bytearray = field(default_factory=bytearray)
    done: threading.Event = field(default_factory=threading.Event)
    live: bool = False
    #: A pty master: reads return at most one line-discipline buffer (4 KiB) at a time.
    terminal: bool = False
    #: Destinations still working (a failing one is dropped).
    raw_file: BinaryIO | None = None
    sink: SinkWriter | None = None
    console_fd: int | None = None
    filtered_file: BinaryIO | None = None
    #: Newlines read so far (``launcher status`` shows the rate).
    newlines: int = 0

    def __post_init__(self) -> None:
        route = self.route
        self.live = route.live and route.console_fd is not None
        if isinstance(route.file, SinkWriter):
            self.sink = route.file
        else:
            self.raw_file = route.file
        self.console_fd = route.console_fd
        if route.filters and route.filtered_file is not None:
            self.filtered_file = route.filtered_file

    @property
    def wants_lines(self) -> bool:
        """Whether some destination takes whole lines (the console off a live terminal, a
        filtered file, a sink)."""
        return (self.console_fd is not None and not self.live) or self.sink is not None or \
            self.filtered_file is not None
