"""Moving worker output from pipes to the console and log files, whole lines at a time.

One thread reads every worker pipe through a selector. Output is cut at the last newline of what
has arrived: complete lines are written at once (each console write holds only whole lines, so
two workers can never interleave mid-line), the incomplete tail waits for the rest of its line,
and whatever is left when a pipe closes (a worker that died mid-line) is written with a newline
added. Each stream is read in order by a single reader, so its order is kept. A very long line
without a newline is flushed once it passes :data:`MAX_PENDING` bytes, to bound memory.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

READ_SIZE = 1 << 16
MAX_PENDING = 1 << 20
#: Bytes of each stderr stream kept in memory for failure reports.
TAIL_BYTES = 1 << 14


def open_log(path: str) -> BinaryIO:
    """Open a log file for appending, readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "ab", buffering=1 << 16)


@dataclass
class StreamRoute:
    """Where one worker stream goes."""

    #: Prefix added to every console line (``b""`` for none).
    prefix: bytes = b""
    #: The console file descriptor (1 or 2), or ``None`` to keep it off the console.
    console_fd: int | None = None
    #: Log file, or ``None``.
    file: BinaryIO | None = None
    #: Lines containing any of these also go to ``filtered_file``.
    filters: Sequence[bytes] = ()
    filtered_file: BinaryIO | None = None
    #: Keep the last :data:`TAIL_BYTES` for failure reports.
    keep_tail: bool = False


@dataclass
class _Stream:
    fd: int
    route: StreamRoute
    pending: bytes = b""
    tail: bytearray = field(default_factory=bytearray)
    done: threading.Event = field(default_factory=threading.Event)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            selectors.DefaultSelector().select(0.01)
            continue
        except (BrokenPipeError, OSError):
            return  # the console went away; files still get every line
        view = view[written:]


class OutputPump:
    """Reads every registered pipe on one thread and routes lines (see module docstring)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._pending: list[_Stream] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="launcher-output", daemon=True)
        self._thread.start()
        # One lock per console fd keeps whole lines whole even with writers besides the pump.
        self.console_lock = threading.Lock()

    def add(self, fd: int, route: StreamRoute) -> _Stream:
        """Start reading the pipe ``fd`` (its read end; the pump closes it at end of stream)."""
        os.set_blocking(fd, False)
        stream = _Stream(fd, route)
        with self._lock:
            self._pending.append(stream)
        self._wake()
        return stream

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def wait(self, streams: Sequence[_Stream], timeout: float | None = None) -> bool:
        """Wait until every stream has reached its end; whether they all did in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for stream in streams:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not stream.done.wait(remaining):
                return False
        return True

    def tail(self, stream: _Stream, lines: int = 20) -> list[str]:
        """The last ``lines`` lines a stream carried (when it kept a tail)."""
        text = bytes(stream.tail).decode("utf-8", "replace")
        return text.splitlines()[-lines:]

    def close(self, timeout: float = 5.0) -> None:
        """Read what is left, close every stream, and stop the thread."""
        self._stopping = True
        self._wake()
        self._thread.join(timeout)
        for stream in list(self._streams.values()):
            self._finish(stream)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the pump thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                pending, self._pending = self._pending, []
            for stream in pending:
                self._streams[stream.fd] = stream
                self._selector.register(stream.fd, selectors.EVENT_READ, stream)
            if self._stopping and not self._streams:
                return
            events = self._selector.select(0.5 if not self._stopping else 0.05)
            if not events:
                self._flush_files()
                if self._stopping:
                    return
                continue
            for key, _ in events:
                stream = key.data
                if stream is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                self._read(stream)
            if len(events) == 1 or not any(k.data for k, _ in events):
                self._flush_files()

    def _read(self, stream: _Stream) -> None:
        try:
            chunk = os.read(stream.fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._finish(stream)
            return
        data = stream.pending + chunk if stream.pending else chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) < MAX_PENDING:
                stream.pending = data
                return
            stream.pending = b""
            self._route(stream, data + b"\n")
            return
        stream.pending = data[cut:]
        self._route(stream, data[:cut])

    def _route(self, stream: _Stream, lines: bytes) -> None:
        """Send complete lines (``lines`` ends with a newline) to every destination."""
        route = stream.route
        if route.console_fd is not None:
            if route.prefix:
                text = route.prefix + lines[:-1].replace(b"\n", b"\n" + route.prefix) + b"\n"
            else:
                text = lines
            with self.console_lock:
                _write_all(route.console_fd, text)
        if route.file is not None:
            route.file.write(lines)
        if route.filtered_file is not None and route.filters:
            selected = [
                route.prefix + line + b"\n"
                for line in lines[:-1].split(b"\n")
                if any(f in line for f in route.filters)
            ]
            if selected:
                route.filtered_file.write(b"".join(selected))
        if route.keep_tail:
            stream.tail += lines[-TAIL_BYTES:]
            if len(stream.tail) > TAIL_BYTES:
                del stream.tail[: len(stream.tail) - TAIL_BYTES]

    def _finish(self, stream: _Stream) -> None:
        if stream.done.is_set():
            return
        # Drain anything still buffered in the pipe (the writer is gone, so reads end).
        while True:
            try:
                chunk = os.read(stream.fd, READ_SIZE)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            stream.pending += chunk
        if stream.pending:
            data = stream.pending if stream.pending.endswith(b"\n") else stream.pending + b"\n"
            stream.pending = b""
            self._route(stream, data)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(stream.fd)
        self._streams.pop(stream.fd, None)
        os.close(stream.fd)
        for handle in (stream.route.file, stream.route.filtered_file):
            if handle is not None:
                with contextlib.suppress(ValueError):
                    handle.flush()
        stream.done.set()

    def _flush_files(self) -> None:
        for stream in self._streams.values():
            for handle in (stream.route.file, stream.route.filtered_file):
                if handle is not None:
                    with contextlib.suppress(ValueError):
                        handle.flush()


def console_fd(stream: str) -> int:
    """The agent's own stdout (``"out"``) or stderr descriptor."""
    return (sys.stdout if stream == "out" else sys.stderr).fileno()
