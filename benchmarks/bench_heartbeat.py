"""What hang detection costs: a heartbeat call in the worker, and the agent's CPU while watching.

- ``heartbeat_ns``: nanoseconds per ``launcher.heartbeat()`` call under launcher (a mapped slot),
  and outside launcher (the no-op), each the median of several million-call loops;
- ``agent_cpu``: the agent's CPU (user + system, from ``/proc/<pid>/stat``) as a percentage of
  one core, with ``--ranks`` workers each beating every 50 ms, measured over a window after
  start-up; with ``--hang-timeout`` and without, so the difference is what watching costs.
  The watch reads every slot every ``min(1, timeout / 4)`` seconds: once a second with
  timeout 4, four times a second with timeout 1.
- ``watch_us``: microseconds for one pass of the watch over ``--ranks`` slots (in-process).

Usage: ``python benchmarks/bench_heartbeat.py [--ranks 64] [--seconds 8] [--json benchmarks/results/heartbeat.json]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BEATER = """
import sys, time
import launcher
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    launcher.heartbeat()
    time.sleep(0.05)
"""

CALLS = """
import os, sys, time
import launcher
n = 1_000_000
best = []
for _ in range(5):
    start = time.perf_counter_ns()
    for _ in range(n):
        launcher.heartbeat()
    best.append((time.perf_counter_ns() - start) / n)
empty = []
for _ in range(5):
    start = time.perf_counter_ns()
    for _ in range(n):
        pass
    empty.append((time.perf_counter_ns() - start) / n)
best.sort(); empty.sort()
print(best[2] - empty[2])
"""


def heartbeat_ns(under_launcher: bool) -> float:
    from launcher.hangs.heartbeat import HEARTBEAT_FILE_ENV, HEARTBEAT_SLOT_ENV
    from launcher.hangs.watch import HeartbeatTable

    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCHER_")}
    with tempfile.TemporaryDirectory() as tmp:
        table = HeartbeatTable(os.path.join(tmp, "beats"), 1)
        if under_launcher:
            env.update({HEARTBEAT_FILE_ENV: table.path, HEARTBEAT_SLOT_ENV: "0"})
        out = subprocess.run([sys.executable, "-c", CALLS], env=env, capture_output=True, text=True, check=True)
        table.close()
    return float(out.stdout)


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` (schedstat: nanoseconds, unlike stat's 10 ms ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended meanwhile
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return total / 1e9


def agent_cpu(ranks: int, seconds: float, hang_timeout: str | None) -> float:
    """Percent of one core the agent used over the steady part of a run of ``ranks`` beaters."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "beater.py"
        script.write_text(textwrap.dedent(BEATER))
        warmup = 4.0
        args = [sys.executable, "-m", "launcher", "--nproc-per-node", str(ranks)]
        if hang_timeout:
            args += ["--hang-timeout", hang_timeout]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "LAUNCHER_"))}
        env["OMP_NUM_THREADS"] = "1"
        process = subprocess.Popen([*args, str(script), str(warmup + seconds + 2)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(warmup)
        start_cpu, start = cpu_seconds(process.pid), time.monotonic()
        time.sleep(seconds)
        used = cpu_seconds(process.pid) - start_cpu
        elapsed = time.monotonic() - start
        _, err = process.communicate(timeout=120)
        if process.returncode != 0:
            raise SystemExit(f"launcher failed ({process.returncode}): {err.decode()[-2000:]}")
    return 100.0 * used / elapsed


def watch_us(ranks: int) -> float:
    from launcher.hangs.watch import HangWatch, HeartbeatTable

    with tempfile.TemporaryDirectory() as tmp:
        table = HeartbeatTable(os.path.join(tmp, "beats"), ranks)
        watch = HangWatch(table, 30.0)
        times = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(100):
                watch.hung()
            times.append((time.perf_counter() - start) / 100 * 1e6)
        table.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = {
        "heartbeat_ns": {"under_launcher": round(heartbeat_ns(True), 1), "outside": round(heartbeat_ns(False), 1)},
        "watch_us": {str(args.ranks): round(watch_us(args.ranks), 1)},
        "agent_cpu_percent": {
            "ranks": args.ranks,
            "with_hang_timeout_4": round(agent_cpu(args.ranks, args.seconds, "4"), 3),
            "with_hang_timeout_1": round(agent_cpu(args.ranks, args.seconds, "1"), 3),
            "without": round(agent_cpu(args.ranks, args.seconds, None), 3),
        },
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
