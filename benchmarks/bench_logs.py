"""launcher beside torchrun: worker output throughput with ``--tee 3 --log-dir D``, on a pipe and on a terminal.

Two workers each print ``--lines`` lines (default 200,000) as fast as they can. Both tools run
``--standalone --nproc-per-node 2 --tee 3 --log-dir D`` on the same script, from the same clean
virtual environment (``benchmarks/.venv``, created on first use with this checkout and
torch==2.13.0), alternating launcher and torchrun run by run. Two cases:

- ``pipe``: the tool's stdout is a regular file (stderr a temporary file), so neither tool waits on
  a slow reader and launcher takes its pipe path;
- ``pty``: the tool's stdin, stdout and stderr are one real pseudo-terminal (Python's ``pty``,
  100 x 250), whose master side this script reads as fast as it can, as a terminal emulator
  would. launcher then gives every console stream a pty of its own (``--worker-tty auto``, the
  default) and shows output live, unfinished lines included; torchrun's workers write their
  ``--tee`` files and its threads copy lines to the terminal. Alongside, the ``floor``: the same
  two workers writing straight into a pty each (set up as launcher sets up its workers' ptys),
  read by this script, with no tool, no console and no files: what the kernel's ptys alone cost,
  the least any tool that gives its workers a terminal can take.

For each run:

- ``wall``: seconds from invoking the command to its exit (on a pty: and to the last byte read
  from the terminal);
- ``console``: lines a person would see that are whole, correctly prefixed worker lines
  (``[default<r>]:rank <r> line <i> ...``), and how many distinct (rank, i) pairs they cover. On a
  pty the terminal's text is rendered first, line by line (``\\r`` returns to column 0 and
  overwrites, ``ESC [K`` erases to the end of the line, the terminal's ``\\r\\n`` is a newline),
  for both tools alike;
- ``files``: such lines in the two ``stdout.log`` files;
- ``own CPU``: CPU seconds of the tool's own processes (agent, helpers): the tool's total, as
  ``wait4`` reports it, less what the workers report for themselves. Less sensitive than wall
  time to other load on the machine.

Throughput is all lines (2 x ``--lines``) over the median wall time; the ratio is torchrun's median
wall time over launcher's, per case. Issue 13 asks for at least 3x (``target_ratio``); on a pty
the floor's ratio is the most any tool giving its workers terminals could show.

Usage: ``python benchmarks/bench_logs.py [--runs 5] [--lines 200000] [--cases pipe,pty]
[--json benchmarks/results/logs.json]``
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import re
import selectors
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path
from typing import Any

from bench_venv import ROOT, VENV, ensure_venv

NPROC = 2
TOOLS = ("launcher", "torchrun")
CASES = ("pipe", "pty")
#: The benchmark terminal's size (rows, columns): wide enough that no worker line wraps.
PTY_SIZE = (100, 250)
#: The throughput ratio issue 13 asks for (launcher's lines/s over torchrun's), in each case.
TARGET_RATIO = 3.0

WORKER = """
import os, resource, sys
rank = os.environ["LOCAL_RANK"]
for i in range(int(sys.argv[1])):
    print(f"rank {rank} line {i} the quick brown fox jumps over the lazy dog")
usage = resource.getrusage(resource.RUSAGE_SELF)
with open(os.path.join(sys.argv[2], "cpu_" + rank), "w") as f:
    f.write(repr(usage.ru_utime + usage.ru_stime))
"""

CONSOLE_LINE = re.compile(rb"^\[default([01])\]:rank \1 line (\d+) the quick brown fox jumps over the lazy dog$",
                          re.MULTILINE)
FILE_LINE = re.compile(rb"^rank ([01]) line (\d+) the quick brown fox jumps over the lazy dog$", re.MULTILINE)
#: What changes a terminal line: a return to column 0, erase to end of line, other escapes, text.
_TOKEN = re.compile(rb"\r|\x1b\[K|\x1b\[[0-9;?]*[A-Za-z]|[^\r\x1b]+|\x1b")


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_")) and k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _count(pattern: re.Pattern[bytes], data: bytes) -> tuple[int, int]:
    """(matching lines, distinct (rank, index) pairs among them)."""
    pairs = pattern.findall(data)
    return len(pairs), len(set(pairs))


def render(data: bytes) -> bytes:
    """The finished lines a terminal shows for ``data`` (the terminal's ``\\r\\n`` as ``\\n``), one per line."""
    shown = []
    for line in data.replace(b"\r\n", b"\n").split(b"\n")[:-1]:
        if b"\r" not in line and b"\x1b" not in line:
            shown.append(line)
            continue
        cells = bytearray()
        col = 0
        for token in _TOKEN.findall(line):
            if token == b"\r":
                col = 0
            elif token == b"\x1b[K":
                del cells[col:]
            elif token[:1] == b"\x1b":
                continue  # colours and the like: not part of the text
            else:
                cells[col:col + len(token)] = token
                col += len(token)
        shown.append(bytes(cells))
    return b"\n".join(shown) + b"\n"


def _run_on_pipe(cmd: list[str]) -> tuple[int, object, bytes, bytes, float]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=clean_env(), stdout=out, stderr=err)
        # wait4: the tool's CPU time, including the workers and helpers it reaped.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return status, usage, out.read(), err.read(), wall


def _run_on_pty(cmd: list[str]) -> tuple[int, object, bytes, bytes, float]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *PTY_SIZE, 0, 0))
    chunks = []
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=clean_env(), stdin=slave, stdout=slave, stderr=slave,
                                start_new_session=True)
        os.close(slave)
        slave = -1
        while True:  # the terminal emulator: read everything, as fast as it comes
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the tool and every worker closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    text = b"".join(chunks)
    return status, usage, text, text, wall


def measure_floor(script: Path, work: Path, lines: int) -> dict[str, float | int]:
    """The pty floor: each worker writes into a raw pty of its own, read here as fast as it comes."""
    cpu_dir = Path(tempfile.mkdtemp(dir=work))
    masters: list[int] = []
    procs = []
    data: dict[int, list[bytes]] = {}
    start = time.perf_counter()
    try:
        for rank in range(NPROC):
            master, slave = pty.openpty()
            masters.append(master)
            attrs = termios.tcgetattr(slave)
            attrs[1] &= ~termios.OPOST  # as launcher.logs.terminal: bytes as written, no input processing
            attrs[3] &= ~(termios.ECHO | termios.ICANON | termios.ISIG | termios.IEXTEN)
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            env = {**clean_env(), "LOCAL_RANK": str(rank)}
            procs.append(subprocess.Popen([str(VENV / "bin" / "python"), "-u", str(script), str(lines), str(cpu_dir)],
                                          env=env, stdin=subprocess.DEVNULL, stdout=slave, start_new_session=True))
            os.close(slave)
            data[master] = []
        with selectors.DefaultSelector() as selector:
            for master in masters:
                os.set_blocking(master, False)
                selector.register(master, selectors.EVENT_READ)
            while selector.get_map():
                for key, _ in selector.select():
                    while True:  # a pty read gives at most 4 KiB: read on until it is empty
                        try:
                            chunk = os.read(key.fd, 1 << 18)
                        except BlockingIOError:
                            break
                        except OSError:  # EIO: the worker closed its terminal
                            chunk = b""
                        if not chunk:
                            selector.unregister(key.fd)
                            break
                        data[key.fd].append(chunk)
        for proc in procs:
            proc.wait()
        wall = time.perf_counter() - start
    finally:
        for master in masters:
            os.close(master)
    if any(proc.returncode for proc in procs):
        raise RuntimeError("a floor worker failed")
    found = distinct = 0
    for chunks in data.values():
        n, d = _count(FILE_LINE, b"".join(chunks))
        found += n
        distinct += d
    workers_cpu = sum(float(path.read_text()) for path in cpu_dir.glob("cpu_*"))
    return {"wall": wall, "workers_cpu": workers_cpu, "lines": found, "lines_distinct": distinct}


def measure(case: str, tool: str, script: Path, work: Path, lines: int) -> dict[str, float | int]:
    log_dir = work / f"logs_{tool}"
    shutil.rmtree(log_dir, ignore_errors=True)
    cpu_dir = Path(tempfile.mkdtemp(dir=work))
    cmd = [str(VENV / "bin" / tool), "--standalone", "--nproc-per-node", str(NPROC), "--tee", "3",
           "--log-dir", str(log_dir), str(script), str(lines), str(cpu_dir)]
    status, usage, console, err, wall = (_run_on_pty if case == "pty" else _run_on_pipe)(cmd)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{tool} on a {case} failed: {err.decode(errors='replace')[-2000:]}")
    if case == "pty":
        console = render(console)
    workers_cpu = sum(float(path.read_text()) for path in cpu_dir.glob("cpu_*"))
    tool_cpu = usage.ru_utime + usage.ru_stime - workers_cpu  # type: ignore[attr-defined]
    console_lines, console_distinct = _count(CONSOLE_LINE, console)
    file_lines = file_distinct = 0
    for path in log_dir.glob("*/attempt_0/*/stdout.log"):
        found, distinct = _count(FILE_LINE, path.read_bytes())
        file_lines += found
        file_distinct += distinct
    return {"wall": wall, "tool_cpu": tool_cpu, "console": console_lines, "console_distinct": console_distinct,
            "files": file_lines, "files_distinct": file_distinct}


def summarise(samples: list[dict[str, float | int]], expected: int) -> dict[str, object]:
    walls = [float(s["wall"]) for s in samples]
    wall = statistics.median(walls)
    return {
        "wall_median_s": round(wall, 4),
        "wall_min_s": round(min(walls), 4),
        "wall_max_s": round(max(walls), 4),
        "lines_per_s": round(expected / wall),
        "tool_cpu_median_s": round(statistics.median(float(s["tool_cpu"]) for s in samples), 4),
        "console_lines_min": min(int(s["console"]) for s in samples),
        "console_lines_median": statistics.median(int(s["console"]) for s in samples),
        "file_lines_min": min(int(s["files"]) for s in samples),
        "every_line_every_run": all(
            s["console"] == s["console_distinct"] == s["files"] == s["files_distinct"] == expected for s in samples
        ),
        "samples": [{k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()} for s in samples],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=200_000, help="lines per worker")
    parser.add_argument("--cases", default=",".join(CASES),
                        help="comma-separated: pipe (console is a file), pty (console is a terminal)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "logs.json"),
                        help="where to write the figures ('' for nowhere)")
    args = parser.parse_args()
    cases = [case for case in args.cases.split(",") if case]
    if not cases or set(cases) - set(CASES):
        parser.error(f"--cases: choose among {', '.join(CASES)}")
    ensure_venv()
    expected = NPROC * args.lines
    samples: dict[str, dict[str, list[dict[str, float | int]]]] = {case: {tool: [] for tool in TOOLS} for case in cases}
    floors: list[dict[str, float | int]] = []
    floor_row: dict[str, Any] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        script = work / "flood.py"
        script.write_text(WORKER)
        for case in cases:
            for tool in TOOLS:  # warm the page cache for both before timing
                measure(case, tool, script, work, 1000)
        for run in range(args.runs):
            for case in cases:
                for tool in TOOLS:  # alternate, so drift hits both alike
                    sample = measure(case, tool, script, work, args.lines)
                    samples[case][tool].append(sample)
                    print(f"run {run + 1}/{args.runs} {case:4s} {tool:9s} {sample['wall']:7.3f} s"
                          f"  cpu {sample['tool_cpu']:6.3f} s  console {sample['console']:>7d}"
                          f"  files {sample['files']:>7d}", flush=True)
                if case == "pty":
                    floor = measure_floor(script, work, args.lines)
                    floors.append(floor)
                    print(f"run {run + 1}/{args.runs} pty  floor     {floor['wall']:7.3f} s"
                          f"  (workers into ptys, no tool)   lines {floor['lines']:>7d}", flush=True)
    load_after = os.getloadavg()
    results: dict[str, dict[str, object]] = {}
    print()
    print(f"{'case':4s} | {'tool':9s} | {'wall (median)':>13s} | {'min..max':>15s} | {'lines/s':>9s} |"
          f" {'own CPU':>8s} | {'console (min)':>13s} | {'files (min)':>11s} | all delivered")
    for case in cases:
        summary = {tool: summarise(samples[case][tool], expected) for tool in TOOLS}
        ours, theirs = summary["launcher"], summary["torchrun"]
        theirs_wall, ours_wall = float(theirs["wall_median_s"]), float(ours["wall_median_s"])  # type: ignore[arg-type]
        ratio = theirs_wall / ours_wall
        results[case] = {**summary, "throughput_ratio": round(ratio, 3)}
        if case == "pty":
            walls = [float(f["wall"]) for f in floors]
            floor_wall = statistics.median(walls)
            floor_row = results[case]["floor"] = {
                "what": "the two workers writing into a raw pty each, read by the benchmark: no tool, console or files",
                "wall_median_s": round(floor_wall, 4),
                "wall_min_s": round(min(walls), 4),
                "wall_max_s": round(max(walls), 4),
                "lines_per_s": round(expected / floor_wall),
                "every_line_every_run": all(f["lines"] == f["lines_distinct"] == expected for f in floors),
                "samples": [{k: round(v, 4) if isinstance(v, float) else v for k, v in f.items()} for f in floors],
            }
            # The most any tool giving its workers a terminal could reach against torchrun here.
            results[case]["floor_ratio"] = round(theirs_wall / floor_wall, 3)
        for tool in TOOLS:
            row = summary[tool]
            print(f"{case:4s} | {tool:9s} | {row['wall_median_s']:>11.3f} s |"
                  f" {row['wall_min_s']:>6.3f}..{row['wall_max_s']:<6.3f}s | {row['lines_per_s']:>9,d} |"
                  f" {row['tool_cpu_median_s']:>6.3f} s | {row['console_lines_min']:>13,d} |"
                  f" {row['file_lines_min']:>11,d} | {row['every_line_every_run']}")
        if case == "pty":
            print(f"{case:4s} | {'floor':9s} | {floor_row['wall_median_s']:>11.3f} s |"
                  f" {floor_row['wall_min_s']:>6.3f}..{floor_row['wall_max_s']:<6.3f}s |"
                  f" {floor_row['lines_per_s']:>9,d} | {'-':>8s} | {'-':>13s} | {'-':>11s} |"
                  f" {floor_row['every_line_every_run']}")
    print()
    for case in cases:
        print(f"{case}: launcher {results[case]['throughput_ratio']:.2f}x torchrun's throughput"
              f" (target >= {TARGET_RATIO:g}x, every line delivered)")
        if case == "pty":
            print(f"pty floor: {results[case]['floor_ratio']:.2f}x torchrun's throughput"
                  " (the most a tool giving its workers ptys could reach here)")
    print(f"{expected:,d} lines per run, {args.runs} runs each; load average {load_before[0]:.2f} before,"
          f" {load_after[0]:.2f} after ({os.cpu_count()} CPUs)")
    if not args.json:
        return
    result: dict[str, object] = {
        "title": "two workers flooding stdout, --standalone --nproc-per-node 2 --tee 3 --log-dir D",
        "lines_per_run": expected,
        "runs": args.runs,
        "target_ratio": TARGET_RATIO,
    }
    if "pipe" in results:  # the pipe case's figures at the top level, where they have always been
        result.update(results["pipe"])
    if "pty" in results:
        result["pty"] = {"terminal_size": list(PTY_SIZE), **results["pty"]}
    result["meta"] = {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                      "load_average_before": [round(x, 2) for x in load_before],
                      "load_average_after": [round(x, 2) for x in load_after],
                      "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
