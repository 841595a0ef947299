"""Moving worker output from pipes to the console, log files and sinks.

One thread reads every worker pipe through a selector. What each destination gets:

* **Log files** get the worker's bytes verbatim, in order, as they arrive (binary, non-UTF-8,
  unfinished last line and all): a file is the faithful record.
* **The console** gets whole lines only. Output is cut at the last newline that has arrived; the
  unfinished tail waits for the rest of its line. Everything bound for one console descriptor in
  one round is joined and written with a single ``write`` under :attr:`OutputPump.console_lock`,
  so lines of different workers never interleave mid-line. A line still unfinished when its pipe
  closes (a worker that died mid-line, even by SIGKILL) is shown with a newline added. A line
  longer than :data:`MAX_PENDING` bytes is shown in pieces of that size, to bound memory.
* **Filtered files** (``--duplicate-*-filters``) and **line sinks** (:mod:`launcher.logs.sink`)
  get whole lines, as the console does.
* **Live streams** (a worker pty, :mod:`launcher.logs.terminal`, shown on a terminal console)
  reach the console as they arrive, unfinished lines included, through a
  :class:`~launcher.logs.screen.Screen` that keeps the streams sharing a terminal from tearing
  each other's lines. Files, filtered files and sinks get what they get from a pipe.

Each stream has a single reader, so its order is kept everywhere. A failing destination (a full
disk, a closed console, a broken sink) is reported once and dropped; the others go on.

Throughput: workers run ``python -u`` and write one line per system call. A reader that wakes for
each of those spends a system call (and a context switch) per line, on the same cores as the
workers. So pipes are enlarged (:data:`PIPE_SIZE`) and, after a round that read something, the
pump sleeps :data:`COALESCE_S` to let output accumulate: each round then moves thousands of lines
with a few system calls, and a line waits at most a couple of milliseconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import selectors
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from launcher.logs.screen import Screen
from launcher.logs.sink import SinkDestination, SinkWriter


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
            _write_all(screen.fd, screen.hide())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for screen in self.screens.values():
                _write_all(screen.fd, screen.show())
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

log = logging.getLogger("launcher.logs")

#: Largest read from one pipe.
READ_SIZE = 1 << 18
#: Pipe capacity asked for (Linux ``F_SETPIPE_SZ``); within the unprivileged 1 MiB maximum, and
#: small enough that many workers stay within the per-user pipe memory quota.
PIPE_SIZE = 1 << 18
#: A console line is cut after this many bytes without a newline (files are never cut).
MAX_PENDING = 1 << 20
#: Bytes of each stream kept in memory for failure reports.
TAIL_BYTES = 1 << 14
#: Pause after a round that moved output, so the next round moves many lines at once.
COALESCE_S = 0.002
#: Longest time buffered file output waits before it is written out while output keeps coming.
FLUSH_INTERVAL_S = 0.1

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
    #: Keep the last :data:`TAIL_BYTES` for failure reports.
    keep_tail: bool = False
    #: Show console output as it arrives, unfinished lines included (a worker pty on a terminal
    #: console); otherwise the console gets whole lines.
    live: bool = False
    #: Called (on the pump thread) whenever the stream carried output: hang watching by output.
    on_output: Callable[[], None] | None = None


@dataclass
class _Stream:
    """One pipe being read, and its state (returned by :meth:`OutputPump.add`)."""

    fd: int
    route: StreamRoute
    #: Start of an unfinished line, held back from the line-wise destinations.
    pending: bytes = b""
    #: The last console line was cut at :data:`MAX_PENDING`, and a newline added there.
    cut_mid_line: bool = False
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
        return (self.console_fd is not None and not self.live) or self.sink is not None or \
            self.filtered_file is not None


def _enlarge_pipe(fd: int) -> None:
    # Best effort: Linux only, and refused once the user's pipe quota is used up.
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)


class OutputPump:
    """Reads every registered pipe on one thread and routes its output (see module docstring)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._pending: list[_Stream] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = False
        #: Console output of the current round, per descriptor, written once at the round's end.
        self._console: dict[int, list[bytes]] = {}
        #: Output of live streams in the current round, in order (``None``: the stream ended).
        self._live: list[tuple[_Stream, bytes | None]] = []
        self._reported: set[int] = set()
        self._last_flush = time.monotonic()
        #: Held around every console write; others writing to fds 1/2 should hold it too.
        self.console_lock = CONSOLE_LOCK
        self._thread = threading.Thread(target=self._run, name="launcher-output", daemon=True)
        self._thread.start()

    def add(self, fd: int, route: StreamRoute) -> _Stream:
        """Start reading the pipe ``fd`` (its read end, or a pty's master; closed at end of stream)."""
        os.set_blocking(fd, False)
        stream = _Stream(fd, route)
        stream.terminal = os.isatty(fd)
        if not stream.terminal:
            _enlarge_pipe(fd)
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
        """The last ``lines`` lines a stream carried (when it kept a tail), decoded leniently.

        A line redrawn with ``\r`` (a progress bar) counts once, as its last frame.
        """
        text = bytes(stream.tail).decode("utf-8", "replace")
        shown = [_last_frame(line) for line in text.split("\n")]
        if shown and not shown[-1]:
            shown.pop()
        return shown[-lines:]

    def close(self, timeout: float = 5.0) -> None:
        """Route what is left, close every stream, and stop the thread."""
        self._stopping = True
        self._wake()
        self._thread.join(timeout)
        if self._thread.is_alive():
            # Stuck writing to a console nobody reads; it is a daemon thread, leave it be.
            log.debug("output thread still busy after %.1fs", timeout)
            return
        # Streams still open here are held by processes the workers left behind.
        self._register_pending()
        for stream in list(self._streams.values()):
            self._finish(stream)
        self._write_console()
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the pump thread ---------------------------------------------------------------------

    def _register_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for stream in pending:
            self._streams[stream.fd] = stream
            self._selector.register(stream.fd, selectors.EVENT_READ, stream)

    def _run(self) -> None:
        while True:
            self._register_pending()
            if self._stopping and not self._streams:
                return
            events = self._selector.select(0.05 if self._stopping else 0.5)
            moved = 0
            from_terminal = False
            for key, _ in events:
                stream = key.data
                if stream is None:
                    with contextlib.suppress(BlockingIOError, OSError):
                        os.read(self._wake_r, 4096)
                    continue
                try:
                    read = self._read(stream)
                    moved += read
                    from_terminal = from_terminal or (read > 0 and stream.terminal)
                except Exception:  # a bug here must not silence every worker
                    if id(stream) not in self._reported:
                        self._reported.add(id(stream))
                        log.exception("error routing worker output")
            self._write_console()
            now = time.monotonic()
            if not moved or now - self._last_flush >= FLUSH_INTERVAL_S:
                self._flush_files()
                self._last_flush = now
            if moved:
                # A pty holds no more than 4 KiB for us: waiting for more would only slow it down.
                if not self._stopping and not from_terminal:
                    time.sleep(COALESCE_S)
            elif self._stopping and not events:
                return

    def _read(self, stream: _Stream) -> int:
        try:
            chunk = os.read(stream.fd, READ_SIZE)
        except BlockingIOError:
            return 0
        except OSError:
            chunk = b""
        if not chunk:
            self._finish(stream)
            return 0
        if stream.terminal:
            chunk = self._read_more(stream, chunk)
        self._deliver(stream, chunk)
        return len(chunk)

    @staticmethod
    def _read_more(stream: _Stream, chunk: bytes) -> bytes:
        """Read on from a pty while it has more (each read gives at most 4 KiB), up to READ_SIZE."""
        parts = [chunk]
        size = len(chunk)
        while size < READ_SIZE:
            try:
                more = os.read(stream.fd, READ_SIZE - size)
            except OSError:  # empty for now (EAGAIN), or closed (EIO): the next round sees which
                break
            if not more:
                break
            parts.append(more)
            size += len(more)
        return b"".join(parts) if len(parts) > 1 else chunk

    def _deliver(self, stream: _Stream, chunk: bytes) -> None:
        if stream.route.on_output is not None:
            stream.route.on_output()
        if stream.raw_file is not None:
            try:
                stream.raw_file.write(chunk)
            except (OSError, ValueError) as exc:
                self._drop(stream, "raw_file", exc)
        if stream.route.keep_tail:
            tail = stream.tail
            tail += chunk[-TAIL_BYTES:]
            if len(tail) > TAIL_BYTES:
                del tail[: len(tail) - TAIL_BYTES]
        if stream.live:
            self._live.append((stream, chunk))
        if not stream.wants_lines:
            return
        data = stream.pending + chunk if stream.pending else chunk
        if stream.cut_mid_line:
            # The newline that ends a line already shown in pieces has already been added.
            stream.cut_mid_line = False
            if data.startswith(b"\n"):
                data = data[1:]
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) < MAX_PENDING:
                stream.pending = data
                return
            # An endless line: show it in pieces rather than hold unbounded memory.
            pieces = [data[i : i + MAX_PENDING] for i in range(0, len(data), MAX_PENDING)]
            stream.pending = pieces.pop() if len(pieces[-1]) < MAX_PENDING else b""
            stream.cut_mid_line = not stream.pending
            self._lines(stream, b"\n".join(pieces) + b"\n")
            return
        stream.pending = data[cut:]
        self._lines(stream, data if cut == len(data) else data[:cut])

    def _lines(self, stream: _Stream, lines: bytes) -> None:
        """Send complete lines (``lines`` ends with a newline) to the line-wise destinations."""
        route = stream.route
        if stream.console_fd is not None and not stream.live:
            prefix = route.prefix
            text = prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n" if prefix else lines
            self._console.setdefault(stream.console_fd, []).append(text)
        if stream.filtered_file is not None and any(f in lines for f in route.filters):
            selected = [
                route.prefix + line + b"\n"
                for line in lines[:-1].split(b"\n")
                if any(f in line for f in route.filters)
            ]
            try:
                stream.filtered_file.write(b"".join(selected))
            except (OSError, ValueError) as exc:
                self._drop(stream, "filtered_file", exc)
        if stream.sink is not None:
            if stream.sink.closed:
                stream.sink = None
                return
            try:
                stream.sink.write_lines(lines, time.time())
            except Exception as exc:  # a third party's sink must not stop the pump
                self._drop(stream, "sink", exc)

    def _drop(self, stream: _Stream, what: str, exc: BaseException) -> None:
        target = getattr(stream, what)
        setattr(stream, what, None)
        if id(target) not in self._reported:
            self._reported.add(id(target))
            name = getattr(target, "name", None) or getattr(getattr(target, "sink", None), "describe", str)()
            log.warning("worker output: stopped writing to %s: %s: %s", name, type(exc).__name__, exc)

    def _write_console(self) -> None:
        if self._console:
            batches, self._console = self._console, {}
            for fd, parts in batches.items():
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                with self.console_lock:
                    _write_all(fd, data)
        if self._live:
            self._write_live()

    def _write_live(self) -> None:
        items, self._live = self._live, []
        with self.console_lock.lock:
            # The screens change as they render: render and write under the lock, so a launcher
            # message taking the lock always finds the screen as its state says.
            out: dict[int, list[bytes]] = {}
            for stream, chunk in items:
                assert stream.console_fd is not None
                screen = self.console_lock.screen(stream.console_fd)
                key = id(stream)
                data = screen.end(key) if chunk is None else screen.write(key, stream.route.prefix, chunk)
                if data:
                    out.setdefault(screen.fd, []).append(data)
            for fd, parts in out.items():
                _write_all(fd, b"".join(parts))

    def _finish(self, stream: _Stream) -> None:
        if stream.done.is_set():
            return
        # Drain what is still in the pipe (if its writers are gone, reads end).
        while True:
            try:
                chunk = os.read(stream.fd, READ_SIZE)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            self._deliver(stream, chunk)
        if stream.pending:
            data, stream.pending = stream.pending, b""
            self._lines(stream, data + b"\n")
        if stream.live:
            self._live.append((stream, None))  # its unfinished line, if any, is shown for good
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(stream.fd)
        self._streams.pop(stream.fd, None)
        os.close(stream.fd)
        # The console part is written before anyone waiting on this stream is told it ended.
        self._write_console()
        for handle in (stream.raw_file, stream.filtered_file, stream.sink):
            if handle is not None:
                with contextlib.suppress(OSError, ValueError):
                    handle.flush()
        stream.done.set()

    def _flush_files(self) -> None:
        for stream in self._streams.values():
            for handle in (stream.raw_file, stream.filtered_file, stream.sink):
                if handle is not None:
                    try:
                        handle.flush()
                    except (OSError, ValueError):
                        pass  # closed under us, or the disk is full: reported on the next write
                    except Exception as exc:
                        self._drop(stream, "sink", exc)


def _last_frame(line: str) -> str:
    if "\r" not in line:
        return line
    frames = [frame for frame in line.split("\r") if frame]
    return frames[-1] if frames else ""


def _write_all(fd: int, data: bytes) -> None:
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
