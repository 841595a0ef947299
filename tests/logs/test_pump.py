"""The output pump's guarantees: every line, whole lines, per-stream order, any bytes."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest
from launcher.logs import pump as pump_module
from launcher.logs.pump import OutputPump, StreamRoute, open_log
from launcher.logs.sink import LineOrigin, LineSink

from tests.logs.conftest import PREFIXED, launch, run_dir

FLOOD = """
import os, sys
rank = os.environ["LOCAL_RANK"]
n, width = int(sys.argv[1]), int(sys.argv[2])
pad = "x" * width
for i in range(n):
    print(f"rank {rank} line {i} {pad} end")
    if i % 7 == 0:
        print(f"rank {rank} err {i} {pad} end", file=sys.stderr)
"""


def _check_console(text: str, nproc: int, n: int, width: int, stream: str) -> None:
    seen: dict[int, list[int]] = {rank: [] for rank in range(nproc)}
    pattern = re.compile(rf"^rank (\d+) {stream} (\d+) x{{{width}}} end$")
    for line in text.splitlines():
        if line.startswith("[launcher]"):
            continue
        match = PREFIXED.match(line)
        assert match, f"line without its prefix (torn or interleaved): {line[:120]!r}"
        body = pattern.match(match.group(2))
        assert body, f"torn or interleaved line: {line[:120]!r}"
        assert body.group(1) == match.group(1)
        seen[int(body.group(1))].append(int(body.group(2)))
    step = 7 if stream == "err" else 1
    for rank in range(nproc):
        assert seen[rank] == list(range(0, n, step)), f"rank {rank}: lines lost or out of order"


@pytest.mark.parametrize("width", [40, 6000])  # 6000 > PIPE_BUF: the kernel may split such writes
def test_every_line_whole_and_in_order(tmp_path, write_script, width):
    script = write_script("flood.py", FLOOD)
    n = 20000 if width == 40 else 1500
    log_dir = tmp_path / "logs"
    result = launch(["--standalone", "--nproc-per-node", "3", "--tee", "3", "--log-dir", str(log_dir),
                     script, str(n), str(width)], timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    _check_console(result.stdout.decode(), 3, n, width, "line")
    _check_console(result.stderr.decode(), 3, n, width, "err")
    attempt = run_dir(log_dir) / "attempt_0"
    for rank in range(3):
        expected = "".join(f"rank {rank} line {i} {'x' * width} end\n" for i in range(n))
        assert (attempt / str(rank) / "stdout.log").read_text() == expected


@pytest.mark.parametrize("death", ["os._exit(0)", "os.kill(os.getpid(), signal.SIGKILL)"])
def test_partial_line_of_a_dying_worker_is_shown(tmp_path, write_script, death):
    script = write_script("die.py", f"""
        import os, signal, sys
        print("first line")
        sys.stdout.write("no newline before death")
        sys.stdout.flush()
        sys.stderr.write("half an error")
        sys.stderr.flush()
        {death}
    """)
    log_dir = tmp_path / "logs"
    result = launch(["--standalone", "--nproc-per-node", "1", "--tee", "3", "--log-dir", str(log_dir), script])
    out = result.stdout.decode().splitlines()
    assert out[:2] == ["[default0]:first line", "[default0]:no newline before death"]
    assert "[default0]:half an error" in result.stderr.decode().splitlines()
    # The file is the worker's exact bytes: no newline was added there.
    rank_dir = run_dir(log_dir) / "attempt_0" / "0"
    assert (rank_dir / "stdout.log").read_bytes() == b"first line\nno newline before death"


def test_long_lines_and_binary_bytes(tmp_path, write_script):
    script = write_script("bin.py", """
        import sys
        out = sys.stdout.buffer
        out.write(b"before\\n")
        out.write(b"L" * (3 * 1024 * 1024) + b"\\n")
        out.write(b"\\xff\\xfe\\x00 not utf-8 \\xc3\\x28\\n")
        out.write(b"crlf line\\r\\n")
        out.write(b"after\\n")
        out.flush()
    """)
    log_dir = tmp_path / "logs"
    result = launch(["--standalone", "--nproc-per-node", "1", "--tee", "3", "--log-dir", str(log_dir), script])
    assert result.returncode == 0, result.stderr
    expected = (b"before\n" + b"L" * (3 * 1024 * 1024) + b"\n\xff\xfe\x00 not utf-8 \xc3\x28\ncrlf line\r\n"
                b"after\n")
    assert (run_dir(log_dir) / "attempt_0" / "0" / "stdout.log").read_bytes() == expected
    console = result.stdout.split(b"\n")
    assert console[0] == b"[default0]:before"
    # The console shows a 3 MiB line in pieces of at most MAX_PENDING bytes, each prefixed.
    pieces = []
    index = 1
    while console[index].startswith(b"[default0]:L"):
        pieces.append(console[index][len(b"[default0]:"):])
        index += 1
    assert b"".join(pieces) == b"L" * (3 * 1024 * 1024)
    assert all(len(piece) <= pump_module.MAX_PENDING for piece in pieces)
    assert console[index:] == [b"[default0]:\xff\xfe\x00 not utf-8 \xc3\x28", b"[default0]:crlf line\r",
                               b"[default0]:after", b""]


def test_stdout_and_stderr_each_keep_their_order(write_script):
    script = write_script("two.py", """
        import sys
        for i in range(3000):
            print(f"o{i}")
            print(f"e{i}", file=sys.stderr)
    """)
    result = launch(["--standalone", "--nproc-per-node", "1", script])
    assert result.returncode == 0
    assert result.stdout.decode().split() == [f"o{i}" for i in range(3000)]
    assert [x for x in result.stderr.decode().split() if x.startswith("e")] == [f"e{i}" for i in range(3000)]


# -- the pump on its own ----------------------------------------------------------------------


class _Capture:
    """A pipe standing in for the console, drained by a thread."""

    def __init__(self) -> None:
        self.read_fd, self.fd = os.pipe()
        self.data = bytearray()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while chunk := os.read(self.read_fd, 1 << 16):
            self.data += chunk

    def close(self) -> bytes:
        os.close(self.fd)
        self._thread.join(5)
        os.close(self.read_fd)
        return bytes(self.data)


def test_pump_survives_a_closed_file_and_a_broken_sink(tmp_path, caplog):
    class Broken(LineSink):
        def write_lines(self, origin: LineOrigin, lines: bytes, timestamp: float) -> None:
            raise RuntimeError("sink is down")

    console = _Capture()
    pump = OutputPump()
    closed_file = open_log(str(tmp_path / "f.log"))
    closed_file.close()
    sink_writer = open_log(Broken().destination(LineOrigin(0, 0, "stdout")))
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    s1 = pump.add(r1, StreamRoute(console_fd=console.fd, file=closed_file, prefix=b"[a]"))
    s2 = pump.add(r2, StreamRoute(console_fd=console.fd, file=sink_writer, prefix=b"[b]"))
    for i in range(3):
        os.write(w1, f"one {i}\n".encode())
        os.write(w2, f"two {i}\n".encode())
        time.sleep(0.01)
    os.close(w1)
    os.close(w2)
    assert pump.wait([s1, s2], timeout=5)
    pump.close()
    text = console.close().decode().splitlines()
    assert [line for line in text if line.startswith("[a]")] == ["[a]one 0", "[a]one 1", "[a]one 2"]
    assert [line for line in text if line.startswith("[b]")] == ["[b]two 0", "[b]two 1", "[b]two 2"]
    messages = " ".join(record.getMessage() for record in caplog.records)
    assert "sink is down" in messages and "stopped writing" in messages


def test_pump_tail_keeps_the_last_stderr_lines():
    pump = OutputPump()
    read_fd, write_fd = os.pipe()
    stream = pump.add(read_fd, StreamRoute(keep_tail=True))
    os.write(write_fd, b"".join(f"line {i}\n".encode() for i in range(5000)))
    os.close(write_fd)
    assert pump.wait([stream], timeout=5)
    assert pump.tail(stream, 3) == ["line 4997", "line 4998", "line 4999"]
    assert len(stream.tail) <= pump_module.TAIL_BYTES
    pump.close()


def test_pump_close_routes_what_a_leftover_process_still_holds():
    console = _Capture()
    pump = OutputPump()
    read_fd, write_fd = os.pipe()
    pump.add(read_fd, StreamRoute(console_fd=console.fd))
    os.write(write_fd, b"done\nunfinished")
    time.sleep(0.05)
    pump.close(timeout=2)  # the write end is still open, as if a grandchild held it
    os.close(write_fd)
    assert console.close() == b"done\nunfinished\n"


def test_open_log_is_private_and_appends(tmp_path):
    path = tmp_path / "x.log"
    for text in (b"a\n", b"b\n"):
        handle = open_log(str(path))
        handle.write(text)
        handle.close()
    assert path.read_bytes() == b"a\nb\n"
    assert path.stat().st_mode & 0o777 == 0o600
