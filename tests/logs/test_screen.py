"""The live console renderer: what it writes for interleaved \\r redraws and lines of several streams."""

from __future__ import annotations

import os

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
