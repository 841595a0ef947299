"""Workers on a terminal (``--worker-tty``): what a person at the launcher's terminal sees.

The launcher runs on a real pseudo-terminal opened here; the test reads its master side, as a
terminal emulator would, with the arrival time of every read, and draws what it read on a
:class:`~tests.logs.test_screen.VirtualTerminal`: the assertions are about the rows on that
screen, as they are after every read and at the end.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import launcher_env
from tests.logs.conftest import LAUNCHER, launch, run_dir
from tests.logs.test_screen import VirtualTerminal

#: Column count of the test terminal: unusual, so that a size that merely looks right cannot pass.
COLUMNS, ROWS = 97, 31


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """The launcher running on a pty of its own; everything it shows, with arrival times."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.master, slave = os.openpty()
        _set_size(slave, ROWS, COLUMNS)
        extra = {"OMP_NUM_THREADS": "1", **(env or {})}

        def controlling_terminal() -> None:
            # A new session adopting the pty, like a shell's job: the kernel then sends SIGWINCH.
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen([*LAUNCHER, *args], stdin=slave, stdout=slave, stderr=slave,
                                     env=launcher_env(extra), cwd=cwd, start_new_session=True,
                                     preexec_fn=controlling_terminal)
        os.close(slave)
        self.chunks: list[tuple[float, bytes]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the launcher and every worker closed the terminal
                break
            if not data:
                break
            with self._lock:
                self.chunks.append((time.time(), data))

    def screen(self, check: Callable[[str], None] | None = None) -> list[str]:
        """The rows of the terminal after everything shown so far, as a person sees them.

        ``check`` is called on every row each time a read changed it: every state the screen
        went through, whatever the pieces the launcher's output arrived in. Rows do not wrap, so
        that a launcher message naming a long temporary path stays one row; whether worker rows
        fit the terminal is for ``check`` to say.
        """
        with self._lock:
            chunks = [chunk for _, chunk in self.chunks]
        term = VirtualTerminal()
        for chunk in chunks:
            term.feed(chunk)
            if check is not None:
                for row in term.take_touched():
                    check(row)
        return term.lines

    @property
    def text(self) -> bytes:
        """Everything shown so far; the terminal's own \\n -> \\r\\n translation undone."""
        with self._lock:
            data = b"".join(chunk for _, chunk in self.chunks)
        return data.replace(b"\r\n", b"\n")

    def wait_for(self, pattern: bytes, timeout: float = 60) -> re.Match[bytes]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text)
            if found:
                return found
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"{pattern!r} never shown; the screen had:\n{self.text.decode(errors='replace')}")

    def arrival(self, needle: bytes) -> float:
        """When the first read containing the end of ``needle`` arrived."""
        seen = b""
        with self._lock:
            chunks = list(self.chunks)
        for when, chunk in chunks:
            seen += chunk
            if needle in seen.replace(b"\r\n", b"\n"):
                return when
        raise AssertionError(f"{needle!r} not shown")

    def resize(self, rows: int, cols: int) -> None:
        _set_size(self.master, rows, cols)  # the kernel signals SIGWINCH to the launcher

    def finish(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        os.close(self.master)
        return code


@pytest.fixture
def terminal(tmp_path):
    started: list[Terminal] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> Terminal:
        term = Terminal(args, tmp_path, env)
        started.append(term)
        return term

    yield start
    for term in started:
        if term.proc.poll() is None:
            os.killpg(term.proc.pid, signal.SIGKILL)
            term.proc.wait()


SIZE_WATCHER = """
import os, signal, sys, time
got = []
signal.signal(signal.SIGWINCH, lambda *_: got.append(1))
def size(fd):
    s = os.get_terminal_size(fd)
    return f"{s.columns}x{s.lines}"
if not sys.stdout.isatty():
    sys.exit(0)  # a rank kept off the console (--local-ranks-filter) writes to /dev/null
print(f"isatty {sys.stdout.isatty()} {sys.stderr.isatty()} size {size(1)} {size(2)}", flush=True)
first = size(1)
deadline = time.monotonic() + 60
while size(1) == first and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(0.2)
print(f"resized {size(1)} {size(2)} sigwinch {bool(got)}", flush=True)
"""


def test_worker_sees_a_terminal_of_the_launchers_size_and_follows_resizes(terminal, write_script):
    script = write_script("size.py", SIZE_WATCHER)
    term = terminal(["--standalone", "--nproc-per-node", "1", script])
    term.wait_for(rb"isatty True True size \d+x\d+ \d+x\d+\n")
    # One worker, nothing tee'd: no prefix, so the worker gets the full width.
    term.wait_for(rb"isatty True True size %dx%d %dx%d\n" % (COLUMNS, ROWS, COLUMNS, ROWS))
    term.resize(40, 123)
    term.wait_for(rb"resized 123x40 123x40 sigwinch True\n")
    assert term.finish() == 0


def test_prefix_width_is_taken_off_the_workers_columns(terminal, write_script):
    script = write_script("size.py", SIZE_WATCHER)
    term = terminal(["--standalone", "--nproc-per-node", "2", "--local-ranks-filter", "1", script])
    width = COLUMNS - len("[default1]:")
    term.wait_for(rb"\[default1\]:isatty True True size %dx%d %dx%d\n" % (width, ROWS, width, ROWS))
    term.resize(40, 123)
    term.wait_for(rb"\[default1\]:resized %dx40 %dx40 sigwinch True\n" % (123 - 11, 123 - 11))
    assert term.finish() == 0
    assert b"[default0]" not in term.text


CR_WRITER = """
import os, sys, time
rank = os.environ["LOCAL_RANK"]
tag = "AB"[int(rank)] * 3
for i in range(8):
    sys.stderr.write(f"\\r{tag} frame {i} at {time.time():.6f}")
    sys.stderr.flush()
    if i % 3 == 2:
        print(f"{tag} line {i}", flush=True)
    time.sleep(0.15)
sys.stderr.write("\\n")
print(f"{tag} done")
"""


def test_carriage_return_updates_show_at_once(terminal, write_script):
    script = write_script("cr.py", CR_WRITER)
    term = terminal(["--standalone", "--nproc-per-node", "1", script])
    found = term.wait_for(rb"\rAAA frame 0 at ([0-9.]+)")
    latency = term.arrival(found.group(0)) - float(found.group(1))
    shown = f"first \\r update on the console {latency * 1000:.1f} ms after the worker wrote it"
    print(shown)
    # The issue: "its first \r update shows within 1 s (goal 100 ms)". Typically a few ms; the
    # bound is the requirement itself, not the goal, so that a loaded machine cannot fail it.
    assert latency < 1.0, f"{shown}: must be < 1 s (goal 100 ms)"
    assert term.finish() == 0
    done = term.arrival(b"AAA done\n")
    frames = [float(t) for t in re.findall(rb"AAA frame \d at ([0-9.]+)", term.text)]
    assert len(set(frames)) == 8
    # Frames reach the screen while the line is still being redrawn, not all at its end (the
    # worker spends 1.2 s on them; a console that waited for the newline gets them all at once).
    early = [t for t in frames if term.arrival(b"at %.6f" % t) < done - 0.2]
    assert len(early) >= 2, term.text


def rank_rows(tags: dict[str, str]) -> Callable[[str], None]:
    """A check for every row a person sees: one rank's text only, after that rank's prefix.

    ``tags`` maps a rank ("0") to the text only that rank writes. A row may be blank, a launcher
    message, or a prefix still being drawn; any other row starts with a rank's prefix, holds no
    other prefix and no other rank's text, and fits the terminal (it would wrap otherwise).
    """
    prefixes = [f"[default{rank}]:" for rank in tags]

    def check(row: str) -> None:
        if not row or row.startswith("[launcher]") or any(prefix.startswith(row) for prefix in prefixes):
            return
        match = re.fullmatch(r"\[default(\d+)\]:(.*)", row)
        assert match and match.group(1) in tags, f"a row without its rank's prefix at the start: {row!r}"
        body = match.group(2)
        assert "[default" not in body, f"two ranks on one row: {row!r}"
        others = [tag for rank, tag in tags.items() if rank != match.group(1)]
        assert not any(tag in body for tag in others), f"another rank's text on this rank's row: {row!r}"
        assert len(row) <= COLUMNS, f"wider than the terminal's {COLUMNS} columns: {row!r}"

    return check


def worker_rows(rows: list[str], rank: int) -> list[str]:
    """The rows of one rank, prefix removed."""
    prefix = f"[default{rank}]:"
    return [row[len(prefix) :] for row in rows if row.startswith(prefix)]


def test_ranks_sharing_the_console_never_tear_each_others_lines(terminal, write_script):
    script = write_script("cr.py", CR_WRITER)
    term = terminal(["--standalone", "--nproc-per-node", "2", script])
    assert term.finish() == 0
    rows = term.screen(check=rank_rows({"0": "AAA", "1": "BBB"}))
    # At the end every line is on the screen once, intact, with its prefix; of each rank's
    # redrawn line its last frame, on a row of its own. (The order of a rank's stdout and stderr
    # rows may vary: they are two streams.)
    for rank, tag in enumerate(("AAA", "BBB")):
        mine = worker_rows(rows, rank)
        lines = sorted(row for row in mine if "frame" not in row)
        assert lines == [f"{tag} done", f"{tag} line 2", f"{tag} line 5"], rows
        frames = [row for row in mine if "frame" in row]
        assert len(frames) == 1 and re.fullmatch(rf"{tag} frame 7 at [0-9.]+", frames[0]), rows
    assert all(row.startswith(("[default0]:", "[default1]:", "[launcher]")) for row in rows), rows


TQDM = """
import time
from tqdm import tqdm
for _ in tqdm(range(30), mininterval=0, desc="train"):
    time.sleep(0.05)
print("epoch finished")
"""


def test_tqdm_draws_in_place(terminal, write_script, tmp_path):
    pytest.importorskip("tqdm")  # the workers run this same interpreter
    script = write_script("bar.py", TQDM)
    log_dir = tmp_path / "logs"
    term = terminal(["--standalone", "--nproc-per-node", "1", "--tee", "3", "--log-dir", str(log_dir), script])
    assert term.finish() == 0
    text = term.text
    done = term.arrival(b"30/30")
    frames = re.findall(rb"\r\[default0\]:train: +(\d+)%\|", text)
    assert len(frames) >= 10, text
    # Redrawn over one line, with frames on the screen well before the bar ends.
    assert term.arrival(b"train:  20%") < done - 0.2
    # On the screen: the bar's last frame on one row, whole, and the line after it.
    rows = term.screen(check=rank_rows({"0": "train"}))
    bar_rows = [row for row in rows if "train:" in row]
    assert len(bar_rows) == 1, rows
    assert re.fullmatch(r"\[default0\]:train: 100%\|[^|]*\| 30/30 \[[^\]]*\]", bar_rows[0]), rows
    assert "[default0]:epoch finished" in rows
    # The file has what tqdm wrote: its \r frames, and its \n not turned into \r\n.
    stderr_log = (run_dir(log_dir) / "attempt_0" / "0" / "stderr.log").read_bytes()
    assert stderr_log.count(b"\rtrain:") >= 10 and b"\r\n" not in stderr_log
    assert stderr_log.endswith(b"\n")


TQDM_RANKS = """
import os, time
from tqdm import tqdm
tag = "AB"[int(os.environ["LOCAL_RANK"])] * 3
for _ in tqdm(range(30), mininterval=0, desc=tag):
    time.sleep(0.04)
print(f"{tag} epoch finished")
"""


def test_tqdm_bars_of_two_ranks_each_end_on_one_row(terminal, write_script):
    pytest.importorskip("tqdm")
    script = write_script("bars.py", TQDM_RANKS)
    term = terminal(["--standalone", "--nproc-per-node", "2", script])
    assert term.finish() == 0
    # Whatever the moment, no row ever mixes the two bars or loses its prefix...
    rows = term.screen(check=rank_rows({"0": "AAA", "1": "BBB"}))
    # ...and at the end each rank's bar is on one row of its own, its last frame whole (no
    # leftover of another frame or rank after it), followed by its line.
    for rank, tag in enumerate(("AAA", "BBB")):
        mine = worker_rows(rows, rank)
        bars = [row for row in mine if row.startswith(f"{tag}:")]
        assert len(bars) == 1, rows
        assert re.fullmatch(rf"{tag}: 100%\|[^|]*\| 30/30 \[[^\]]*\]", bars[0]), rows
        assert sorted(mine) == sorted([bars[0], f"{tag} epoch finished"]), rows
        # tqdm drew to the width it was given (less one column, as tqdm does): the terminal's
        # less the prefix, so the row fits without wrapping.
        assert len(f"[default{rank}]:" + bars[0]) == COLUMNS - 1, rows
    assert all(row.startswith(("[default0]:", "[default1]:", "[launcher]")) for row in rows), rows


EXACT = r"""
import sys
sys.stdout.buffer.write(b"one\ntwo\r\nthree\rTHREE\n\tlast")
"""


def test_log_files_keep_the_exact_bytes(terminal, write_script, tmp_path):
    script = write_script("exact.py", EXACT)
    log_dir = tmp_path / "logs"
    term = terminal(["--standalone", "--nproc-per-node", "1", "--tee", "3", "--log-dir", str(log_dir), script])
    assert term.finish() == 0
    stdout_log = (run_dir(log_dir) / "attempt_0" / "0" / "stdout.log").read_bytes()
    assert stdout_log == b"one\ntwo\r\nthree\rTHREE\n\tlast"
    assert b"[default0]:\tlast\n" in term.text  # the unfinished last line, ended on the console


@pytest.mark.parametrize("death", ["os._exit(0)", "os.kill(os.getpid(), signal.SIGKILL)"])
def test_last_partial_line_of_a_dying_worker_is_shown(terminal, write_script, death):
    script = write_script("die.py", f"""
        import os, signal, sys
        print("hello")
        sys.stdout.write("Continue? [y/N] ")
        sys.stdout.flush()
        {death}
    """)
    term = terminal(["--standalone", "--nproc-per-node", "1", script])
    term.finish()
    assert re.search(rb"(?m)^hello\nContinue\? \[y/N\] \n", term.text), term.text


MIXED = r"""
import os, sys
print(f"tty {sys.stdout.isatty()} {sys.stderr.isatty()}")
for i in range(3):
    sys.stdout.write(f"\rstep {i}")
    sys.stdout.flush()
sys.stdout.write("\n")
sys.stderr.write("warn\n")
sys.stdout.write("bye")
"""


@pytest.mark.parametrize("flags", [[], ["--tee", "3"], ["--nproc-per-node", "2"]])
def test_without_a_terminal_output_is_as_before(write_script, tmp_path, flags):
    script = write_script("mixed.py", MIXED)
    base = ["--standalone", *flags, "--log-dir", str(tmp_path / "logs"), script]
    before = launch(["--worker-tty", "never", *base])
    now = launch(base)
    assert before.returncode == now.returncode == 0
    assert b"tty False False" in now.stdout
    # The same lines, in the same order for each rank (ranks interleave as they happen to).
    for stream in ("stdout", "stderr"):
        assert _by_rank(getattr(now, stream)) == _by_rank(getattr(before, stream))


def _by_rank(output: bytes) -> dict[bytes, list[bytes]]:
    ranks: dict[bytes, list[bytes]] = {}
    for line in output.split(b"\n"):
        if not line.startswith(b"[launcher]"):
            ranks.setdefault(line[: line.find(b"]") + 1], []).append(line)
    return ranks


def test_always_gives_a_terminal_even_when_output_is_piped(write_script, tmp_path):
    script = write_script("mixed.py", MIXED)
    result = launch(["--standalone", "--worker-tty", "always", script])
    assert result.returncode == 0, result.stderr
    # The worker has a terminal; a piped console still gets whole lines, as before.
    assert result.stdout == b"tty True True\n\rstep 0\rstep 1\rstep 2\nbye\n"


def test_never_keeps_pipes_on_a_terminal(terminal, write_script):
    script = write_script("mixed.py", MIXED)
    term = terminal(["--standalone", "--worker-tty", "never", script])
    assert term.finish() == 0
    assert b"tty False False\n" in term.text


@pytest.mark.parametrize("how", ["flag", "env"])
def test_invalid_mode_is_one_line_and_exit_2(write_script, how):
    script = write_script("ok.py", "print('started')\n")
    if how == "flag":
        result = launch(["--standalone", "--worker-tty", "sometimes", script])
    else:
        result = launch(["--standalone", script], env={"PET_WORKER_TTY": "sometimes"})
    assert result.returncode == 2
    assert result.stderr.decode().strip().count("\n") == 0
    assert "--worker-tty" in result.stderr.decode() and "sometimes" in result.stderr.decode()
    assert b"started" not in result.stdout


def test_env_fallback_selects_the_mode(write_script):
    script = write_script("tty.py", "import sys; print(sys.stdout.isatty())\n")
    result = launch(["--standalone", script], env={"PET_WORKER_TTY": "always"})
    assert result.returncode == 0 and result.stdout == b"True\n"


FLOOD = """
import os
rank = os.environ["LOCAL_RANK"]
for i in range(5000):
    print(f"rank {rank} line {i} the quick brown fox")
"""


def test_a_flood_of_lines_on_a_terminal_arrives_whole(terminal, write_script, tmp_path):
    # A pty hands out its data in pieces of at most 4 KiB, cut anywhere: lines are continued
    # across pieces, and a piece of another rank erases and redraws the unfinished one.
    script = write_script("flood.py", FLOOD)
    log_dir = tmp_path / "logs"
    term = terminal(["--standalone", "--nproc-per-node", "2", "--tee", "3", "--log-dir", str(log_dir), script])
    assert term.finish() == 0
    # Every state of the screen: one rank's text per row; at the end each line once, in order.
    rows = term.screen(check=rank_rows({"0": "rank 0 ", "1": "rank 1 "}))
    assert all(row.startswith(("[default0]:", "[default1]:", "[launcher]")) for row in rows), rows[:50]
    for rank in (0, 1):
        assert worker_rows(rows, rank) == [f"rank {rank} line {i} the quick brown fox" for i in range(5000)]
        stdout_log = (run_dir(log_dir) / "attempt_0" / str(rank) / "stdout.log").read_bytes()
        assert stdout_log == b"".join(b"rank %d line %d the quick brown fox\n" % (rank, i) for i in range(5000))
