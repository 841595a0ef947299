"""Showing several workers' terminal output live on the launcher's terminal without tearing.

When the launcher's console is a terminal and a worker writes to a pty (:mod:`launcher.logs.terminal`),
its output is shown as it arrives, unfinished lines included: a tqdm bar redrawn with ``\\r`` or a
prompt without a newline appears at once. Several streams share one screen, so a :class:`Screen`
keeps track of the one line that is still open (the cursor sits at its end) and whose it is:

* The stream that owns the open line writes straight through. The console prefix is put at the
  start of every line *and after every* ``\\r``: a redraw returns to column 0 and would
  otherwise overwrite the prefix.
* Another stream writing erases the open line first (``\\r`` and *erase to end of line*,
  ``ESC [K``), writes its own output on the freed line, and, if it wrote whole lines only, draws
  the erased line again below them. If it left a line open itself, that line now holds the
  screen; the other stays hidden until its stream writes again (it is redrawn then) or ends its
  line (which is then written in full). A stream's hidden line is remembered by its last ``\\r``
  frame, the part a terminal would show.
* Anyone else writing to the console (the agent's own messages) erases and redraws the open
  line around its message the same way (:meth:`Screen.hide`, :meth:`Screen.show`).

So a person sees every whole line once, intact, with the right prefix, and at most one live line
(the latest) at the bottom. Only ``\\r``, ``\\n`` and ``ESC [K`` are interpreted; other control
sequences (colours, cursor movement of nested bars) pass through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Hashable

#: Return to column 0 and clear the line.
ERASE = b"\r\x1b[K"
#: A hidden line is redrawn from at most this many of its last bytes.
MAX_VIEW = 1 << 13

#: Line starts that need a prefix: after ``\n``, and after a ``\r`` not ending the line, when more follows.
_BREAK = re.compile(rb"(?:\n|\r(?!\n))(?!\Z)")


def _view(line: bytes) -> bytes:
    """What a terminal shows of an unfinished line: its last non-empty ``\\r`` frame."""
    if b"\r" in line:
        for frame in reversed(line.split(b"\r")):
            if frame:
                return frame[-MAX_VIEW:]
        return b""
    return line[-MAX_VIEW:]


class _Open:
    """A stream's unfinished line."""

    __slots__ = ("prefix", "line")

    def __init__(self, prefix: bytes, line: bytes) -> None:
        self.prefix = prefix
        self.line = line


class Screen:
    """The state of one terminal the launcher writes to (see the module docstring).

    Every method returns the bytes to write; the caller writes them in the same order, under the
    console lock, so the state always matches what is on the screen.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: Unfinished lines by stream, least recently written first.
        self._open: dict[Hashable, _Open] = {}
        #: The stream whose line is displayed with the cursor at its end, if any.
        self._owner: Hashable | None = None
        #: The owner's cursor is at column 0 after ``\r``/``\n``: its next byte needs a prefix.
        self._needs_prefix = False

    def write(self, key: Hashable, prefix: bytes, data: bytes) -> bytes:
        """Output ``data`` of stream ``key``, whose console lines start with ``prefix``."""
        if not data:
            return b""
        out: list[bytes] = []
        state = self._open.pop(key, None)
        if self._owner is not None and self._owner != key:
            out.append(ERASE)
            self._owner = None
        if self._owner == key:
            at_start = self._needs_prefix
        else:
            # The line is free: start it, with this stream's hidden unfinished line if it has one.
            at_start = True
            # Redraw its hidden line, unless the new output starts by drawing over it anyway.
            if state is not None and state.line and not (data[:1] == b"\r" and data[1:2] != b"\n"):
                text, at_start = self._redraw(state)
                out.append(text)
        if prefix:
            if at_start and not (data[:1] == b"\r" and data[1:2] not in (b"", b"\n")):
                out.append(prefix)  # (a leading \r gets its prefix from _BREAK)
            if b"\r" in data:
                out.append(_BREAK.sub(lambda match: match.group() + prefix, data))
            else:  # the common case, whole lines: as fast as the pipe path's prefixing
                out.append(data[:-1].replace(b"\n", b"\n" + prefix) + data[-1:])
        else:
            out.append(data)
        end = data.rfind(b"\n")
        before = state.line if state is not None and end == -1 else b""
        line = before + data[end + 1 :]
        if line:
            if len(line) > 2 * MAX_VIEW:  # bound memory: keep what a redraw needs
                line = _view(line) + (b"\r" if line.endswith(b"\r") else b"")
            self._open[key] = _Open(prefix, line)
            self._owner = key
            self._needs_prefix = data.endswith((b"\r", b"\n"))
        else:
            self._owner = None
            out.append(self.show())
        return b"".join(out)

    def end(self, key: Hashable) -> bytes:
        """Stream ``key`` ended: show its unfinished line for good, with a newline added."""
        state = self._open.pop(key, None)
        if state is None:
            return b""
        if self._owner == key:
            self._owner = None
            return b"\n" + self.show()
        out = [ERASE] if self._owner is not None else []
        self._owner = None
        out.append(state.prefix + _view(state.line) + b"\n")
        out.append(self.show())
        return b"".join(out)

    def hide(self) -> bytes:
        """Free the current line for someone else's whole lines (undo with :meth:`show`)."""
        if self._owner is None:
            return b""
        self._owner = None
        return ERASE

    def show(self) -> bytes:
        """Draw again the most recent unfinished line, if the screen's line is free."""
        if self._owner is not None or not self._open:
            return b""
        key = next(reversed(self._open))
        self._owner = key
        text, self._needs_prefix = self._redraw(self._open[key])
        return text

    @staticmethod
    def _redraw(state: _Open) -> tuple[bytes, bool]:
        """Bytes that draw ``state``'s line on a cleared line, and whether the cursor is at column 0."""
        view = _view(state.line)
        if not view:
            return b"", True
        if state.line.endswith(b"\r"):
            # Its writer returned to column 0 and will draw the next frame from there.
            return state.prefix + view + b"\r", True
        return state.prefix + view, False
