"""launcher beside torchrun: worker output throughput with ``--tee 3 --log-dir D``.

Two workers each print ``--lines`` lines (default 200,000) as fast as they can. Both tools run
``--standalone --nproc-per-node 2 --tee 3 --log-dir D`` on the same script, from the same clean
virtual environment (``benchmarks/.venv``, created on first use with this checkout and
torch==2.13.0), alternating launcher and torchrun run by run. For each run:

- ``wall``: seconds from invoking the command to its exit;
- ``console``: lines on the captured stdout that are whole, correctly prefixed worker lines
  (``[default<r>]:rank <r> line <i> ...``), and how many distinct (rank, i) pairs they cover;
- ``files``: such lines in the two ``stdout.log`` files;
- ``own CPU``: CPU seconds of the tool's own processes (agent, helpers): the tool's total, as
  ``wait4`` reports it, less what the workers report for themselves. Less sensitive than wall
  time to other load on the machine.

Throughput is all lines (2 x ``--lines``) over the median wall time. The console is a regular
file, so neither tool waits on a slow reader.

Usage: ``python benchmarks/bench_logs.py [--runs 5] [--lines 200000] [--json benchmarks/results/logs.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_venv import ROOT, VENV, ensure_venv

NPROC = 2
TOOLS = ("launcher", "torchrun")

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



def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_")) and k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _count(pattern: re.Pattern[bytes], data: bytes) -> tuple[int, int]:
    """(matching lines, distinct (rank, index) pairs among them)."""
    pairs = pattern.findall(data)
    return len(pairs), len(set(pairs))


def measure(tool: str, script: Path, work: Path, lines: int) -> dict[str, float | int]:
    log_dir = work / f"logs_{tool}"
    shutil.rmtree(log_dir, ignore_errors=True)
    console = work / f"console_{tool}.txt"
    cpu_dir = Path(tempfile.mkdtemp(dir=work))
    cmd = [str(VENV / "bin" / tool), "--standalone", "--nproc-per-node", str(NPROC), "--tee", "3",
           "--log-dir", str(log_dir), str(script), str(lines), str(cpu_dir)]
    with open(console, "wb") as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=clean_env(), stdout=out, stderr=err)
        # wait4: the tool's CPU time, including the workers and helpers it reaped.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{tool} failed: {err.read().decode()[-2000:]}")
    workers_cpu = sum(float(path.read_text()) for path in cpu_dir.glob("cpu_*"))
    tool_cpu = usage.ru_utime + usage.ru_stime - workers_cpu
    console_lines, console_distinct = _count(CONSOLE_LINE, console.read_bytes())
    file_lines = file_distinct = 0
    for path in log_dir.glob("*/attempt_0/*/stdout.log"):
        found, distinct = _count(FILE_LINE, path.read_bytes())
        file_lines += found
        file_distinct += distinct
    return {"wall": wall, "tool_cpu": tool_cpu, "console": console_lines, "console_distinct": console_distinct,
            "files": file_lines, "files_distinct": file_distinct}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=200_000, help="lines per worker")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "logs.json"))
    args = parser.parse_args()
    ensure_venv()
    expected = NPROC * args.lines
    samples: dict[str, list[dict[str, float | int]]] = {tool: [] for tool in TOOLS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        script = work / "flood.py"
        script.write_text(WORKER)
        for tool in TOOLS:  # warm the page cache for both before timing
            measure(tool, script, work, 1000)
        for run in range(args.runs):
            for tool in TOOLS:  # alternate, so drift hits both alike
                sample = measure(tool, script, work, args.lines)
                samples[tool].append(sample)
                print(f"run {run + 1}/{args.runs} {tool:9s} {sample['wall']:7.3f} s  cpu {sample['tool_cpu']:6.3f} s"
                      f"  console {sample['console']:>7d}  files {sample['files']:>7d}", flush=True)
    summary: dict[str, dict[str, object]] = {}
    for tool in TOOLS:
        walls = [float(s["wall"]) for s in samples[tool]]
        wall = statistics.median(walls)
        summary[tool] = {
            "wall_median_s": round(wall, 4),
            "wall_min_s": round(min(walls), 4),
            "wall_max_s": round(max(walls), 4),
            "lines_per_s": round(expected / wall),
            "tool_cpu_median_s": round(statistics.median(float(s["tool_cpu"]) for s in samples[tool]), 4),
            "console_lines_min": min(int(s["console"]) for s in samples[tool]),
            "console_lines_median": statistics.median(int(s["console"]) for s in samples[tool]),
            "file_lines_min": min(int(s["files"]) for s in samples[tool]),
            "every_line_every_run": all(
                s["console"] == s["console_distinct"] == s["files"] == s["files_distinct"] == expected
                for s in samples[tool]
            ),
            "samples": [{k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()}
                        for s in samples[tool]],
        }
    ours, theirs = summary["launcher"], summary["torchrun"]
    speedup = float(theirs["wall_median_s"]) / float(ours["wall_median_s"])  # type: ignore[arg-type]
    print()
    print(f"{'tool':9s} | {'wall (median)':>13s} | {'min..max':>15s} | {'lines/s':>9s} | {'own CPU':>8s} | "
          f"{'console (min)':>13s} | {'files (min)':>11s} | all delivered")
    for tool in TOOLS:
        row = summary[tool]
        print(f"{tool:9s} | {row['wall_median_s']:>11.3f} s | {row['wall_min_s']:>6.3f}..{row['wall_max_s']:<6.3f}s |"
              f" {row['lines_per_s']:>9,d} | {row['tool_cpu_median_s']:>6.3f} s | {row['console_lines_min']:>13,d} |"
              f" {row['file_lines_min']:>11,d} | {row['every_line_every_run']}")
    print(f"\nthroughput: launcher {speedup:.2f}x torchrun (target >= 2x, every line delivered);"
          f" {expected:,d} lines per run, {args.runs} runs each")
    result = {
        "title": "two workers flooding stdout, --standalone --nproc-per-node 2 --tee 3 --log-dir D",
        "lines_per_run": expected,
        "runs": args.runs,
        "launcher": ours,
        "torchrun": theirs,
        "throughput_ratio": round(speedup, 3),
        "target_ratio": 2.0,
        "meta": {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                 "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
