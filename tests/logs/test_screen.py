"""The live console renderer: what it writes for interleaved \\r redraws and lines of several streams."""

from __future__ import annotations

import codecs
import os
import re

from launcher.logs.pump import ConsoleLock
from launcher.logs.screen import ERASE, MAX_VIEW, Screen

P0, P1 = b"[default0]:", b"[default1]:"


def test_one_stream_passes_through_with_a_prefix_after_every_line_start():
    screen = Screen(1)
    assert screen.write(0, P0, b"  0%|\r 10%|") == P0 + b"  0%|\r" + P0 + b" 10%|"
    assert screen.write(0, P0, b"\r 20%|") == b"\r" + P0 + b" 20%|"
    assert screen.write(0, P0, b"\r100%|\nnext\n") == b"\r" + P0 + b"100%|\n" + P0 + b"next\n"
    # A \r ending a chunk: the prefix goes before whatever comes next, and not before the \n of \r\n.
    assert screen.write(0, P0, b"a\r") == P0 + b"a\r"
    assert screen.write(0, P0, b"b") == P0 + b"b"
    assert screen.write(0, P0, b"\r\n") == b"\r\n"


def test_no_prefix_means_the_bytes_unchanged():
    screen = Screen(1)
    for chunk in (b"\x1b[32mgreen\x1b[0m", b"\rframe", b"\n", b"tail"):
        assert screen.write(0, b"", chunk) == chunk


def test_whole_lines_of_another_stream_go_above_the_open_line():
    screen = Screen(1)
    screen.write(0, P0, b"bar 10%")
    assert screen.write(1, P1, b"hello\n") == ERASE + P1 + b"hello\n" + P0 + b"bar 10%"
    # The bar's owner carries on where it was.
    assert screen.write(0, P0, b"\rbar 20%") == b"\r" + P0 + b"bar 20%"


def test_two_open_lines_take_turns_and_end_in_full():
    screen = Screen(1)
    screen.write(0, P0, b"bar 10%")
    assert screen.write(1, P1, b"Continue? ") == ERASE + P1 + b"Continue? "
    # Stream 0's next frame replaces its hidden line: no stale redraw first.
    assert screen.write(0, P0, b"\rbar 20%") == ERASE + b"\r" + P0 + b"bar 20%"
    # Stream 1 continues its hidden line: it is redrawn, then continued.
    assert screen.write(1, P1, b"[y/N]") == ERASE + P1 + b"Continue? " + b"[y/N]"
    # Stream 0 ends: its line is written out in full, and stream 1's drawn again below.
    assert screen.end(0) == ERASE + P0 + b"bar 20%\n" + P1 + b"Continue? [y/N]"
    assert screen.end(1) == b"\n"
    assert screen.end(1) == b""


def test_a_hidden_line_that_ended_with_cr_is_redrawn_with_the_cursor_at_column_0():
    screen = Screen(1)
    screen.write(0, P0, b"frame 1\r")
    screen.write(1, P1, b"x")
    screen.write(1, P1, b"\n")  # frees the line: stream 0 is drawn again
    assert screen.write(0, P0, b"frame 2\r") == P0 + b"frame 2\r"


def test_memory_of_an_endless_line_is_bounded():
    screen = Screen(1)
    for _ in range(100):
        screen.write(0, P0, b"x" * 1000)
    assert len(screen._open[0].line) <= 2 * MAX_VIEW


def test_launcher_messages_move_the_open_line_out_of_the_way():
    read, write = os.pipe()
    lock = ConsoleLock()
    screen = Screen(write)
    lock.screens[0] = screen
    os.write(write, screen.write(0, P0, b"bar 10%"))
    with lock:
        os.write(write, b"[launcher] WARNING: something\n")
    os.close(write)
    with os.fdopen(read, "rb") as shown:
        assert shown.read() == P0 + b"bar 10%" + ERASE + b"[launcher] WARNING: something\n" + P0 + b"bar 10%"


# -- what a person sees: a small terminal emulator -------------------------------------------------

#: One control sequence (CSI with its parameters, or ESC and one character), one control
#: character, or a run of printable text.
_VT_TOKEN = re.compile(r"\x1b\[([0-9;?]*)([@-~])|\x1b[^\[]|[\x00-\x1f\x7f]|[^\x00-\x1f\x7f]+")
_VT_COMPLETE = re.compile(r"\x1b(?:\[[0-9;?]*[@-~]|[^\[])")


class VirtualTerminal:
    """Enough of a VT100 to see what a person would see: the rows of the screen, scrollback included.

    Understands printable text (UTF-8, one column a character), ``\\r``, ``\\n`` (down one row,
    same column, as a raw terminal: the ``\\r`` of ``\\r\\n`` returns to column 0), ``\\b``,
    ``\\t``, erase in line (``ESC [K``, ``ESC [1K``, ``ESC [2K``) and the cursor moves
    ``ESC [nA``/``B``/``C``/``D`` that nested progress bars use; other sequences (colours) change
    no text and are skipped. With ``columns``, text wraps as on a real terminal: writing past the
    last column continues at the start of the next row (the wrap happens when the next character
    comes, so a full-width line followed by ``\\r`` does not wrap). Bytes may arrive in pieces cut
    anywhere (mid-sequence, mid-character): :meth:`feed` them as they come.
    """

    def __init__(self, columns: int | None = None) -> None:
        self.columns = columns
        self._rows: list[list[str]] = [[]]
        self.row = self.col = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""  # an escape sequence cut off at the end of the last piece
        #: Rows changed since the last :meth:`take_touched` (to check each state a person saw).
        self.touched: set[int] = set()

    def feed(self, data: bytes) -> VirtualTerminal:
        text = self._held + self._decoder.decode(data)
        self._held = ""
        start = text.rfind("\x1b")
        if start != -1 and not _VT_COMPLETE.match(text, start):
            text, self._held = text[:start], text[start:]
        for token in _VT_TOKEN.finditer(text):
            self._apply(token)
        return self

    def take_touched(self) -> list[str]:
        """The rows changed since the last call, as they are now."""
        touched, self.touched = self.touched, set()
        return ["".join(self._rows[row]).rstrip() for row in sorted(touched)]

    @property
    def lines(self) -> list[str]:
        """The screen's rows, top to bottom, without trailing blanks (nor trailing empty rows)."""
        lines = ["".join(row).rstrip() for row in self._rows]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    def _apply(self, token: re.Match[str]) -> None:
        text = token.group()
        final = token.group(2)
        if final is not None:
            count = max(1, int(token.group(1))) if token.group(1).isdigit() else 1
            if final == "A":
                self.row = max(0, self.row - count)
            elif final == "B":
                self._down(count)
            elif final == "C":
                self.col += count
                if self.columns is not None:
                    self.col = min(self.col, self.columns - 1)
            elif final == "D":
                self.col = max(0, min(self.col, self._last_column()) - count)
            elif final == "K":
                self.touched.add(self.row)
                line = self._rows[self.row]
                how = token.group(1) or "0"
                if how == "0":
                    del line[self.col :]
                elif how == "1":
                    line[: self.col + 1] = [" "] * min(len(line), self.col + 1)
                elif how == "2":
                    line.clear()
        elif text == "\r":
            self.col = 0
        elif text == "\n":
            self._down(1)
        elif text == "\b":
            self.col = max(0, min(self.col, self._last_column()) - 1)
        elif text == "\t":
            self.col = self.col + 8 - self.col % 8
            if self.columns is not None:
                self.col = min(self.col, self.columns - 1)
        elif text[0] >= " " and text[0] != "\x7f":
            self._put(text)
        # Other control characters and escapes (bell, ESC 7/8, ...) change no text.

    def _last_column(self) -> int:
        return self.col if self.columns is None else self.columns - 1

    def _down(self, count: int) -> None:
        self.row += count
        while len(self._rows) <= self.row:
            self._rows.append([])

    def _put(self, text: str) -> None:
        while text:
            if self.columns is not None and self.col >= self.columns:  # the pending wrap
                self._down(1)
                self.col = 0
            room = len(text) if self.columns is None else self.columns - self.col
            piece, text = text[:room], text[room:]
            self.touched.add(self.row)
            line = self._rows[self.row]
            if len(line) < self.col:
                line.extend(" " * (self.col - len(line)))
            line[self.col : self.col + len(piece)] = piece
            self.col += len(piece)


def render(data: bytes, columns: int | None = None) -> list[str]:
    """The rows a terminal (``columns`` wide, or unbounded) shows after ``data``."""
    return VirtualTerminal(columns).feed(data).lines


def test_the_emulator_draws_as_a_terminal_does():
    assert render(b"abc\r\nxy\rZ") == ["abc", "Zy"]
    assert render(b"hello world\rbye\x1b[K") == ["bye"]
    assert render(b"\x1b[32mgreen\x1b[0m text") == ["green text"]
    # \n alone goes down and keeps the column, as on a raw terminal.
    assert render(b"ab\ncd") == ["ab", "  cd"]
    # Nested bars: down with \n, back up with ESC[A, right and left.
    assert render(b"top\r\nbottom\x1b[A\rTOP\x1b[2C!\x1b[2D?") == ["TOP ?!", "bottom"]
    # Wrapping happens when the next character comes, so a full-width line can return with \r.
    assert render(b"12345\r", columns=5) == ["12345"]
    assert render(b"123456\r", columns=5) == ["12345", "6"]
    assert render(b"\t|", columns=20) == ["        |"]
    # Pieces cut anywhere, even inside an escape sequence or a UTF-8 character.
    data = "bar 10%|█▌\r\x1b[Kbar 20%|██\x1b[1A".encode()
    term = VirtualTerminal()
    for i in range(len(data)):
        term.feed(data[i : i + 1])
    assert term.lines == render(data) == ["bar 20%|██"]


def test_what_the_screen_writes_renders_as_one_intact_line_per_stream():
    screen = Screen(1)
    out = [
        screen.write(0, P0, b"bar  10%"),
        screen.write(1, P1, b"hello\n"),
        screen.write(0, P0, b"\rbar  20%"),
        screen.write(1, P1, b"Continue? "),
        screen.write(0, P0, b"\rbar 100%\n"),
        screen.write(1, P1, b"[y/N]"),
        screen.end(1),
    ]
    # On a terminal the kernel turns the launcher's \n into \r\n (ONLCR) before the emulator sees it.
    assert render(b"".join(out).replace(b"\n", b"\r\n")) == [
        "[default1]:hello",
        "[default0]:bar 100%",
        "[default1]:Continue? [y/N]",
    ]
