"""LineBuffer: whole lines out of arbitrary chunks, endless lines in bounded pieces."""

from __future__ import annotations

from launcher.logs.lines import MAX_PENDING, TAIL_BYTES, LineBuffer, keep_tail, tail_lines


def test_unfinished_line_waits_for_its_newline() -> None:
    lines = LineBuffer()
    assert lines.feed(b"one\ntw") == b"one\n"
    assert lines.feed(b"o") == b""
    assert lines.feed(b"\nthree\nfo") == b"two\nthree\n"
    assert lines.finish() == b"fo\n"
    assert lines.finish() == b""


def test_endless_line_comes_in_pieces_and_its_newline_is_not_doubled() -> None:
    lines = LineBuffer()
    out = lines.feed(b"x" * (2 * MAX_PENDING))
    assert out == b"x" * MAX_PENDING + b"\n" + b"x" * MAX_PENDING + b"\n"
    # The newline ending the cut line was already given: it is not given again.
    assert lines.feed(b"\nnext\n") == b"next\n"


def test_tail_keeps_the_last_bytes_and_last_frames() -> None:
    tail = bytearray()
    keep_tail(tail, b"a" * TAIL_BYTES + b"\n")
    keep_tail(tail, b"line 1\nprogress 10%\rprogress 100%\n")
    assert len(tail) == TAIL_BYTES
    assert tail_lines(tail, 2) == ["line 1", "progress 100%"]
