"""launcher beside torchrun: start-up, first collective, restart gap and the agent's memory.

Both tools run the same scripts with ``--standalone --nproc-per-node 4``, from the same clean
virtual environment (``benchmarks/.venv``, created on first use with this checkout and
torch==2.13.0), alternating launcher and torchrun run by run; each figure is the median of
``--runs`` runs. The workers report their own clock readings to files, so the agent's output
handling does not enter the measurement.

- ``noop``: from invoking the command to the last worker's first line;
- ``allreduce``: from invoking the command until every rank finished its first gloo all_reduce;
- ``restart``: from a worker's failing exit to every replacement worker running;
- ``rss``: peak resident memory of the launcher's own processes (agent, plus launcher's
  watchdog), not the workers.

Usage: ``python benchmarks/bench_startup.py [--runs 7] [--json benchmarks/results/startup.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_venv import ROOT, VENV, ensure_venv

NPROC = 4

NOOP = """
import time
t = time.time()
import os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    f.write(repr(t))
"""

ALLREDUCE = """
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
t = time.time()
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    f.write(repr(t))
dist.destroy_process_group()
"""

RESTART = """
import time
t = time.time()
import os, sys
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(sys.argv[1], f"{attempt}_{os.environ['RANK']}"), "w") as f:
    f.write(repr(time.time() if attempt == "0" else t))
if attempt == "0":
    if os.environ["RANK"] == "1":
        time.sleep(0.5)  # let every worker of the first attempt start
        with open(os.path.join(sys.argv[1], "failed"), "w") as f:
            f.write(repr(time.time()))
        os._exit(1)
    time.sleep(30)
"""

SLEEP = """
import time
time.sleep(1.5)
"""



def commands(python: Path) -> dict[str, list[str]]:
    flags = ["--standalone", "--nproc-per-node", str(NPROC)]
    return {
        "launcher": [str(VENV / "bin" / "launcher"), *flags],
        "torchrun": [str(VENV / "bin" / "torchrun"), *flags],
    }


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    # As on a user's machine, compiled bytecode is cached: without this, an editable install
    # recompiles every module on every start while torch's installed .pyc files are used.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(cmd: list[str], script: Path, out: Path, extra: list[str] = ()) -> float:
    start = time.time()
    result = subprocess.run([*cmd, *extra, str(script), str(out)], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {result.stderr.decode()[-2000:]}")
    return start


def measure_noop(cmd: list[str], work: Path) -> float:
    out = Path(tempfile.mkdtemp(dir=work))
    start = _run(cmd, work / "noop.py", out)
    return max(float((out / str(r)).read_text()) for r in range(NPROC)) - start


def measure_allreduce(cmd: list[str], work: Path) -> float:
    out = Path(tempfile.mkdtemp(dir=work))
    start = _run(cmd, work / "allreduce.py", out)
    return max(float((out / str(r)).read_text()) for r in range(NPROC)) - start


def measure_restart(cmd: list[str], work: Path) -> float:
    out = Path(tempfile.mkdtemp(dir=work))
    _run(cmd, work / "restart.py", out, ["--max-restarts", "1"])
    failed = float((out / "failed").read_text())
    return max(float((out / f"1_{r}").read_text()) for r in range(NPROC)) - failed


def _peak_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _is_worker(pid: int, script: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return script.encode() in f.read()
    except OSError:
        return True


def measure_rss(cmd: list[str], work: Path) -> float:
    """Peak RSS (MB) of the agent plus its non-worker children, sampled every 5 ms."""
    script = str(work / "sleep.py")
    proc = subprocess.Popen([*cmd, script, str(work)], env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    peaks: dict[int, int] = {}
    while proc.poll() is None:
        peaks[proc.pid] = max(peaks.get(proc.pid, 0), _peak_kb(proc.pid))
        for child in _children(proc.pid):
            if not _is_worker(child, script):
                peaks[child] = max(peaks.get(child, 0), _peak_kb(child))
        time.sleep(0.005)
    return sum(peaks.values()) / 1024


SCENARIOS = {
    "noop": (measure_noop, "s", "no-op worker: invoke -> last worker's first line", 0.10),
    "allreduce": (measure_allreduce, "s", "gloo: invoke -> every rank's first all_reduce done", 0.75),
    "restart": (measure_restart, "s", "restart gap: failing exit -> every replacement running", 0.25),
    "rss": (measure_rss, "MB", "peak RSS of the launcher's own processes", None),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "startup.json"))
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    python = ensure_venv()
    tools = commands(python)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, source in (("noop.py", NOOP), ("allreduce.py", ALLREDUCE), ("restart.py", RESTART),
                             ("sleep.py", SLEEP)):
            (work / name).write_text(source)
        results: dict[str, dict[str, object]] = {}
        for scenario in args.only or SCENARIOS:
            measure, unit, title, target = SCENARIOS[scenario]
            samples: dict[str, list[float]] = {"launcher": [], "torchrun": []}
            measure(tools["launcher"], work)  # warm the page cache for both before timing
            measure(tools["torchrun"], work)
            for _ in range(args.runs):
                for tool in ("launcher", "torchrun"):  # alternate, so drift hits both alike
                    samples[tool].append(measure(tools[tool], work))
            ours, theirs = statistics.median(samples["launcher"]), statistics.median(samples["torchrun"])
            results[scenario] = {
                "title": title,
                "unit": unit,
                "launcher_median": round(ours, 4),
                "torchrun_median": round(theirs, 4),
                "ratio": round(ours / theirs, 3),
                "target_ratio": target,
                "runs": args.runs,
                "launcher_samples": [round(x, 4) for x in samples["launcher"]],
                "torchrun_samples": [round(x, 4) for x in samples["torchrun"]],
            }
            print(f"{scenario:10s} {ours:9.3f} {unit:2s}  torchrun {theirs:9.3f} {unit:2s}  ratio {ours / theirs:.3f}"
                  + (f" (target <= {target})" if target else ""), flush=True)
    print()
    print(f"{'scenario':10s} | {'launcher':>10s} | {'torchrun':>10s} | {'ratio':>6s} | target | what")
    for scenario, row in results.items():
        target = f"<= {row['target_ratio']}" if row["target_ratio"] else "report"
        print(f"{scenario:10s} | {row['launcher_median']:>8.3f}{row['unit']:>2s} | {row['torchrun_median']:>8.3f}"
              f"{row['unit']:>2s} | {row['ratio']:>6.3f} | {target:6s} | {row['title']}")
    meta = {"nproc_per_node": NPROC, "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(Path(args.json).read_text()) if args.only and Path(args.json).exists() else {}
    existing.update(results)
    existing["meta"] = meta
    Path(args.json).write_text(json.dumps(existing, indent=2) + "\n")
    print(f"\nwritten to {args.json}")


if __name__ == "__main__":
    main()
