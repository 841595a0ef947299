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
with a few system calls, and a line waits at most a couple of milliseconds. A pty is read on until
it is empty instead, without the pause: it holds too little for one (see :meth:`OutputPump._run`).

This module is the reading thread and the routing to destinations. Cutting chunks into whole
lines is :mod:`launcher.logs.lines`, where a stream goes :mod:`launcher.logs.routes`, and the
console's lock :mod:`launcher.logs.console_lock`; their public names stay importable from here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from collections.abc import Sequence

from launcher.logs.console_lock import CONSOLE_LOCK, ConsoleLock, console_fd, write_all
from launcher.logs.lines import MAX_PENDING, TAIL_BYTES, keep_tail, tail_lines
from launcher.logs.routes import PIPE_SIZE, PumpedStream, StreamRoute, enlarge_pipe, open_log

__all__ = [
    "CONSOLE_LOCK",
    "COALESCE_S",
    "FLUSH_INTERVAL_S",
    "MAX_PENDING",
    "PIPE_SIZE",
    "READ_SIZE",
    "TAIL_BYTES",
    "ConsoleLock",
    "OutputPump",
    "StreamRoute",
    "console_fd",
    "open_log",
]

log = logging.getLogger("launcher.logs")

#: Largest read from one pipe.
READ_SIZE = 1 << 18
#: Pause after a round that moved output, so the next round moves many lines at once.
COALESCE_S = 0.002
#: Longest time buffered file output waits before it is written out while output keeps coming.
FLUSH_INTERVAL_S = 0.1


class OutputPump:
    """Reads every registered pipe on one thread and routes its output (see module docstring)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._streams: dict[int, PumpedStream] = {}
        self._lock = threading.Lock()
        self._pending: list[PumpedStream] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = False
        #: Console output of the current round, per descriptor, written once at the round's end.
        self._console: dict[int, list[bytes]] = {}
        #: Output of live streams in the current round, in order (``None``: the stream ended).
        self._live: list[tuple[PumpedStream, bytes | None]] = []
        self._reported: set[int] = set()
        self._last_flush = time.monotonic()
        #: Held around every console write; others writing to fds 1/2 should hold it too.
        self.console_lock = CONSOLE_LOCK
        self._thread = threading.Thread(target=self._run, name="launcher-output", daemon=True)
        self._thread.start()

    def add(self, fd: int, route: StreamRoute) -> PumpedStream:
        """Start reading the pipe ``fd`` (its read end, or a pty's master; closed at end of stream)."""
        os.set_blocking(fd, False)
        stream = PumpedStream(fd, route)
        stream.terminal = os.isatty(fd)
        if not stream.terminal:
            enlarge_pipe(fd)
        with self._lock:
            self._pending.append(stream)
        self._wake()
        return stream

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def wait(self, streams: Sequence[PumpedStream], timeout: float | None = None) -> bool:
        """Wait until every stream has reached its end; whether they all did in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for stream in streams:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not stream.done.wait(remaining):
                return False
        return True

    def tail(self, stream: PumpedStream, lines: int = 20) -> list[str]:
        """The last ``lines`` lines a stream carried (when it kept a tail), decoded leniently.

        A line redrawn with ``\r`` (a progress bar) counts once, as its last frame.
        """
        return tail_lines(stream.tail, lines)

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
                # Not after a round that read a pty: a pty holds only about 20 KiB before its
                # writer blocks (the pipes here 256 KiB), which a worker printing flat out fills
                # in about a millisecond, so a pause would stall the workers rather than batch
                # their lines. (Measured: pausing after pty rounds of 4 KiB or more slowed a
                # 2 x 200,000-line flood on a terminal, 2.99 s against 2.43 s median.)
                if not self._stopping and not from_terminal:
                    time.sleep(COALESCE_S)
            elif self._stopping and not events:
                return

    def _read(self, stream: PumpedStream) -> int:
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
    def _read_more(stream: PumpedStream, chunk: bytes) -> bytes:
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

    def _deliver(self, stream: PumpedStream, chunk: bytes) -> None:
        stream.newlines += chunk.count(b"\n")  # memchr speed: free beside the copy the read made
        if stream.route.on_output is not None:
            stream.route.on_output()
        if stream.raw_file is not None:
            try:
                stream.raw_file.write(chunk)
            except (OSError, ValueError) as exc:
                self._drop(stream, "raw_file", exc)
        if stream.route.keep_tail:
            keep_tail(stream.tail, chunk)
        if stream.live:
            self._live.append((stream, chunk))
        if stream.wants_lines:
            lines = stream.lines.feed(chunk)
            if lines:
                self._lines(stream, lines)

    def _lines(self, stream: PumpedStream, lines: bytes) -> None:
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

    def _drop(self, stream: PumpedStream, what: str, exc: BaseException) -> None:
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
                    write_all(fd, data)
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
                write_all(fd, b"".join(parts))

    def _finish(self, stream: PumpedStream) -> None:
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
        last = stream.lines.finish()
        if last:
            self._lines(stream, last)
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

