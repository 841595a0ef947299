"""Whole lines out of a byte stream that arrives in arbitrary chunks, and the tail kept for reports.

The console, filtered files and line sinks get whole lines only: :class:`LineBuffer` holds back
the unfinished end of each chunk until its newline arrives, and cuts a line that never ends into
pieces of :data:`MAX_PENDING` bytes so memory stays bounded. :func:`keep_tail` and
:func:`tail_lines` keep and read the last bytes of a stream for failure reports.
"""

from __future__ import annotations

__all__ = ["MAX_PENDING", "TAIL_BYTES", "LineBuffer", "keep_tail", "tail_lines"]

#: A console line is cut after this many bytes without a newline (files are never cut).
MAX_PENDING = 1 << 20
#: Bytes of each stream kept in memory for failure reports.
TAIL_BYTES = 1 << 14


class LineBuffer:
    """The unfinished line of one stream, between chunks."""

    __slots__ = ("cut_mid_line", "pending")

    def __init__(self) -> None:
        #: Start of an unfinished line, held back until its newline arrives.
        self.pending = b""
        #: The last line was cut at :data:`MAX_PENDING`, and a newline added there.
        self.cut_mid_line = False

    def feed(self, chunk: bytes) -> bytes:
        """The whole lines ``chunk`` completes, ending with a newline; ``b""`` when it completes none."""
        data = self.pending + chunk if self.pending else chunk
        if self.cut_mid_line:
            # The newline that ends a line already shown in pieces has already been added.
            self.cut_mid_line = False
            if data.startswith(b"\n"):
                data = data[1:]
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) < MAX_PENDING:
                self.pending = data
                return b""
            # An endless line: give it in pieces rather than hold unbounded memory.
            pieces = [data[i : i + MAX_PENDING] for i in range(0, len(data), MAX_PENDING)]
            self.pending = pieces.pop() if len(pieces[-1]) < MAX_PENDING else b""
            self.cut_mid_line = not self.pending
            return b"\n".join(pieces) + b"\n"
        self.pending = data[cut:]
        return data if cut == len(data) else data[:cut]

    def finish(self) -> bytes:
        """The unfinished last line with a newline added (the stream ended); ``b""`` when none."""
        data, self.pending = self.pending, b""
        return data + b"\n" if data else b""


def keep_tail(tail: bytearray, chunk: bytes) -> None:
    """Add ``chunk`` to ``tail``, keeping only its last :data:`TAIL_BYTES` bytes."""
    tail += chunk[-TAIL_BYTES:]
    if len(tail) > TAIL_BYTES:
        del tail[: len(tail) - TAIL_BYTES]


def tail_lines(tail: bytes | bytearray, lines: int) -> list[str]:
    """The last ``lines`` lines of ``tail``, decoded leniently.

    A line redrawn with ``\\r`` (a progress bar) counts once, as its last frame.
    """
    text = bytes(tail).decode("utf-8", "replace")
    shown = [_last_frame(line) for line in text.split("\n")]
    if shown and not shown[-1]:
        shown.pop()
    return shown[-lines:]


def _last_frame(line: str) -> str:
    if "\r" not in line:
        return line
    frames = [frame for frame in line.split("\r") if frame]
    return frames[-1] if frames else ""
