"""Line sinks: a LogsSpecs may send worker output to an object instead of a file.

torchrun's :class:`~launcher.logs.specs.LogsDest` maps each local rank to a *path*, which cannot
express "one JSON-lines file for the whole node" or "lines to a log service". This module adds
that as a compatible extension: a LogsSpecs puts a :class:`SinkDestination` where it would put a
path (``dest.stdouts[rank] = sink.destination(origin)``). A :class:`SinkDestination` *is* a
``str`` (naming the sink, for code that only displays paths), so a LogsDest holding one is still
a valid torchrun LogsDest; the output pump recognises it and hands the sink whole lines, with
where they came from and when they were read. Tee works as for files: put the same destination
in ``tee_stdouts``/``tee_stderrs`` to also show the lines on the console.

A sink is opened once per destination that uses it (the agent opens each rank's stdout and
stderr destination separately) and is closed when the last of them is closed, at the end of
each attempt.
"""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class LineOrigin:
    """Where a batch of lines comes from."""

    #: The worker's local rank on this node.
    local_rank: int
    #: The worker's global rank, ``-1`` when the LogsSpecs did not know it.
    rank: int
    #: ``"stdout"`` or ``"stderr"``.
    stream: str
    #: The worker's role (``--role``).
    role: str = "default"
    #: ``TORCHELASTIC_RESTART_COUNT`` of the attempt.
    restart_count: int = 0


class LineSink(abc.ABC):
    """Receives worker output whole lines at a time.

    The pump calls :meth:`write_lines` from its own thread, one call per batch of complete lines
    of one stream, in the order the worker wrote them. A sink should be quick: a slow sink slows
    every worker's output on the node. An exception from a sink is reported once and the sink
    then receives nothing more; the job goes on.
    """

    def __init__(self) -> None:
        self._users = 0
        self._lock = threading.Lock()

    def destination(self, origin: LineOrigin) -> SinkDestination:
        """A value to put in a LogsDest in place of a path: ``origin``'s lines come here."""
        return SinkDestination(self, origin)

    def describe(self) -> str:
        """A short human-readable name (shown where a path would be)."""
        return type(self).__name__

    @abc.abstractmethod
    def write_lines(self, origin: LineOrigin, lines: bytes, timestamp: float) -> None:
        """Receive one or more complete lines of ``origin``.

        ``lines`` are the worker's raw bytes (not necessarily UTF-8), each line ending in
        ``b"\\n"``; a last line the worker left unfinished when it died, or one longer than the
        pump's limit, is ended with a newline added by the pump. ``timestamp`` is
        :func:`time.time` when the pump read them.
        """

    def open(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called before the first line of an attempt (acquire files or connections here)."""

    def flush(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Push buffered lines out; called when the pump is idle and at least every 0.1 s."""

    def close(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called once when the attempt's last destination using this sink is closed."""

    # -- reference counting, used by the pump's writers ----------------------------------------

    def _attach(self) -> None:
        with self._lock:
            self._users += 1
            first = self._users == 1
        if first:
            self.open()

    def _detach(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.close()


class SinkDestination(str):
    """A LogsDest entry that routes a stream to a :class:`LineSink` (see the module docstring).

    Being a ``str`` keeps a LogsDest that holds it valid for torchrun-typed code; its text is
    ``<sink NAME: rank R local_rank L stdout>``, never an existing file name.
    """

    sink: LineSink
    origin: LineOrigin

    def __new__(cls, sink: LineSink, origin: LineOrigin) -> SinkDestination:
        text = (
            f"<sink {sink.describe()}: rank {origin.rank} local_rank {origin.local_rank} {origin.stream}>"
        )
        value = super().__new__(cls, text)
        value.sink = sink
        value.origin = origin
        return value


class SinkWriter:
    """What :func:`launcher.logs.pump.open_log` returns for a :class:`SinkDestination`.

    It looks like a binary file to the code that opens and closes destinations; the pump sends
    it whole lines through :meth:`write_lines`.
    """

    def __init__(self, destination: SinkDestination) -> None:
        self.sink = destination.sink
        self.origin = destination.origin
        self.closed = False
        self.sink._attach()

    def write_lines(self, lines: bytes, timestamp: float) -> None:
        """Pass complete lines to the sink."""
        self.sink.write_lines(self.origin, lines, timestamp)

    def write(self, data: bytes) -> int:
        """File-like fallback: treat ``data`` as lines (the pump itself calls write_lines)."""
        import time

        if data:
            self.write_lines(data if data.endswith(b"\n") else data + b"\n", time.time())
        return len(data)

    def flush(self) -> None:
        """Flush the sink."""
        if not self.closed:
            self.sink.flush()

    def close(self) -> None:
        """Release this destination; the sink closes with its last one."""
        if not self.closed:
            self.closed = True
            self.sink._detach()
