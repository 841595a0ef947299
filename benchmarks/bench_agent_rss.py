"""The agent's own peak memory and CPU with 64 local workers: launcher against torchrun.

Both tools run ``--standalone --nproc-per-node 64`` (``python -m launcher`` / ``python -m
torch.distributed.run``, from the interpreter that runs this script) with a worker that sleeps
2 s, so the agent is watched while all 64 run; the two alternate run by run, median of ``--runs``.

- peak RSS: the agent's ``VmHWM`` (``/proc/PID/status``) plus that of each of its children that
  is not a worker (launcher's watchdog helper; torchrun has none), sampled every 20 ms until the
  agent exits (the high-water mark is kept by the kernel, so sampling misses no peak, only what
  a process reaches in its last 20 ms);
- CPU: user + system seconds of the same processes (``/proc/PID/stat``, every thread; workers
  excluded). The agent's figure is read once it has exited and before it is reaped (``waitid``
  with ``WNOWAIT``), so it is complete; a helper's is its last sample.

Every process of a run is killed afterwards (see ``bench_agents.reap``).

Usage: ``.tox/py3/bin/python benchmarks/bench_agent_rss.py [--nproc 64] [--runs 3]
[--json benchmarks/results/agent_rss.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_agents import ROOT, TOOLS, clean_env, reap
from bench_startup import _peak_kb

SLEEP = """
import time
time.sleep(2.0)
"""
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads, not its children); 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    """Every child of ``pid``, whichever of its threads started it."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found


def cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def measure(tool: str, nproc: int, work: Path, timeout: float) -> dict[str, float]:
    """One run: the agent's and its helpers' peak RSS (MB) and CPU seconds, and the wall time."""
    script = str(work / "sleep.py")
    mark = uuid.uuid4().hex
    cmd = [sys.executable, *TOOLS[tool], "--standalone", "--nproc-per-node", str(nproc),
           "--monitor-interval", "0.1", script]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=clean_env(mark), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    own = cmdline(proc.pid)  # a child still showing this has been forked and not yet exec'd: wait
    agent_kb = 0
    helpers_kb: dict[int, int] = {}
    helpers_cpu: dict[int, float] = {}
    workers: set[int] = set()
    try:
        while True:
            agent_kb = max(agent_kb, _peak_kb(proc.pid))
            for child in children(proc.pid):
                if child in workers:
                    continue
                line = cmdline(child)
                if not line or line == own:
                    continue
                if script.encode() in line:
                    workers.add(child)
                    continue
                helpers_kb[child] = max(helpers_kb.get(child, 0), _peak_kb(child))
                helpers_cpu[child] = max(helpers_cpu.get(child, 0.0), cpu_seconds(child))
            # Exited? Asked without reaping, so the zombie's CPU figures can still be read.
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"{tool} did not finish in {timeout:g} s")
            time.sleep(0.02)
        agent_cpu = cpu_seconds(proc.pid)
        wall = time.monotonic() - start
        proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} exited with status {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reap(mark)
    return {
        "agent_rss_mb": agent_kb / 1024,
        "helpers_rss_mb": sum(helpers_kb.values()) / 1024,
        "total_rss_mb": (agent_kb + sum(helpers_kb.values())) / 1024,
        "agent_cpu_s": agent_cpu,
        "helpers_cpu_s": sum(helpers_cpu.values()),
        "total_cpu_s": agent_cpu + sum(helpers_cpu.values()),
        "helpers": len(helpers_kb),
        "workers_seen": len(workers),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "agent_rss.json")
    args = parser.parse_args()
    samples: dict[str, list[dict[str, float]]] = {"launcher": [], "torchrun": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "sleep.py").write_text(SLEEP)
        for tool in samples:  # warm the page cache for both before measuring
            measure(tool, args.nproc, work, args.timeout)
        for _ in range(args.runs):
            for tool in samples:  # alternate, so drift hits both alike
                samples[tool].append(measure(tool, args.nproc, work, args.timeout))
                print(tool, {k: round(v, 2) for k, v in samples[tool][-1].items()}, flush=True)
    results: dict[str, Any] = {
        "title": f"the agent's own peak RSS and CPU, --standalone --nproc-per-node {args.nproc}, workers sleep 2 s",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "python": f"{sys.executable} ({platform.python_version()})",
        "runs": args.runs,
        "median": {},
        "samples": {tool: [{k: round(v, 3) for k, v in s.items()} for s in runs] for tool, runs in samples.items()},
    }
    for tool, runs in samples.items():
        results["median"][tool] = {key: round(statistics.median(s[key] for s in runs), 3) for key in runs[0]}
    ours, theirs = results["median"]["launcher"], results["median"]["torchrun"]
    results["ratio"] = {
        key: round(ours[key] / theirs[key], 3) for key in ("total_rss_mb", "total_cpu_s") if theirs[key]
    }
    for tool in samples:
        m = results["median"][tool]
        print(f"{tool:9s} peak RSS {m['total_rss_mb']:.1f} MB (agent {m['agent_rss_mb']:.1f} + helpers "
              f"{m['helpers_rss_mb']:.1f}), CPU {m['total_cpu_s']:.2f} s, wall {m['wall_s']:.2f} s")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
