"""What straggler detection costs: the training step with it on and off, and the agent's CPU.

- ``step_ms``: a real gloo DDP job (tests/stragglers/scripts/ddp_job.py: ``--ranks`` ranks, a
  small model, ``--compute`` seconds of "compute" a step, DDP's all-reduce every step) run for
  ``--steps`` steps with ``--straggler-detection`` and without, alternately, ``--rounds`` times
  each; the median time per step of rank 0 (timed from its first step, start-up excluded). With
  detection, DDP's gradient all-reduce goes through launcher's timing comm hook (Python) instead
  of DDP's built-in C++ one, and every other collective through a Python wrapper.
- ``ddp_step_us``: in one job with detection on, a small DDP model's forward and backward (no
  compute added: the overhead alone) through launcher's timing hook and through DDP's built-in
  C++ all-reduce, alternated step by step, ``--ab-steps`` each: the median of each and what the
  hook adds to a step, free of the start-up noise of separate runs.
- ``collective_overhead_ns``: nanoseconds :func:`launcher.stragglers.timing.enter` and ``leave``
  add to one collective (in-process, a mapped slot).
- ``agent_cpu_percent``: the agent's CPU (every thread, from ``/proc/<pid>/task/*/schedstat``) as
  a percentage of one core with 64 standard-library workers each "in a collective" 25 ms of
  every 50 ms (timing.enter/leave around a sleep), over a window after start-up; with detection
  at intervals of 5 s (the default) and 1 s, and without.

Usage: ``python benchmarks/bench_stragglers.py [--ranks 2] [--steps 600] [--json benchmarks/results/stragglers.json]``
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDP_JOB = ROOT / "tests" / "stragglers" / "scripts" / "ddp_job.py"

WORKER = """
import sys, time
from launcher.stragglers import timing
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    start = timing.enter()
    time.sleep(0.025)
    timing.leave(start)
    time.sleep(0.025)
"""

AB_STEPS = """
import json, statistics, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.set_num_threads(1)
torch.manual_seed(0)
def model():
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
timed = DistributedDataParallel(model())  # launcher's timing hook, registered at its first forward
builtin = DistributedDataParallel(model())
builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)  # DDP's C++ all-reduce, untimed
x, y = torch.randn(32, 256), torch.randn(32, 10)
times = {"timed": [], "builtin": []}
for step in range(int(sys.argv[2])):
    for name, ddp in (("timed", timed), ("builtin", builtin)) if step % 2 else (("builtin", builtin), ("timed", timed)):
        start = time.perf_counter()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        times[name].append(time.perf_counter() - start)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as handle:
        json.dump({k: statistics.median(v[50:]) * 1e6 for k, v in times.items()}, handle)
dist.destroy_process_group()
"""

CALLS = """
import time
from launcher.stragglers import timing
n = 200_000
runs, empty = [], []
for _ in range(5):
    start = time.perf_counter_ns()
    for _ in range(n):
        timing.leave(timing.enter())
    runs.append((time.perf_counter_ns() - start) / n)
    start = time.perf_counter_ns()
    for _ in range(n):
        pass
    empty.append((time.perf_counter_ns() - start) / n)
print(sorted(runs)[2] - sorted(empty)[2])
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "LAUNCHER_"))}
    env["OMP_NUM_THREADS"] = "1"
    return env


def step_ms(ranks: int, steps: int, compute: float, detection: bool) -> float:
    """Rank 0's milliseconds per step over ``steps`` steps."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "steps"
        args = [sys.executable, "-m", "launcher", "--standalone", "--nproc-per-node", str(ranks)]
        if detection:
            args.append("--straggler-detection")
        args += [str(DDP_JOB), "--steps", str(steps), "--compute", str(compute), "--report", str(report)]
        out = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise SystemExit(f"the job failed ({out.returncode}): {out.stderr[-2000:]}")
        done, seconds = report.read_text().split()
    return 1000.0 * float(seconds) / int(done)


def hook_overhead_us(ranks: int, steps: int) -> dict[str, float]:
    """Median microseconds of a forward and backward of a small DDP model (no compute added) with
    launcher's timing hook and with DDP's built-in C++ all-reduce, alternated step by step in one
    job with detection on: what the hook adds to every step, free of start-up noise."""
    with tempfile.TemporaryDirectory() as tmp:
        script, out = Path(tmp) / "ab.py", Path(tmp) / "ab.json"
        script.write_text(AB_STEPS)
        args = [sys.executable, "-m", "launcher", "--standalone", "--nproc-per-node", str(ranks),
                "--straggler-detection", str(script), str(out), str(steps)]
        run = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            raise SystemExit(f"the job failed ({run.returncode}): {run.stderr[-2000:]}")
        medians = json.loads(out.read_text())
    return {"timed_hook": round(medians["timed"], 1), "builtin": round(medians["builtin"], 1),
            "added": round(medians["timed"] - medians["builtin"], 1)}


def collective_overhead_ns() -> float:
    from launcher.stragglers.slots import TimingTable
    from launcher.stragglers.timing import STRAGGLER_FILE_ENV, STRAGGLER_SLOT_ENV

    with tempfile.TemporaryDirectory() as tmp:
        table = TimingTable(os.path.join(tmp, "timings"), 1)
        env = {**_env(), STRAGGLER_FILE_ENV: table.path, STRAGGLER_SLOT_ENV: "0"}
        out = subprocess.run([sys.executable, "-c", CALLS], env=env, capture_output=True, text=True, check=True)
        table.close()
    return float(out.stdout)


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` (schedstat: nanoseconds)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended meanwhile
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return total / 1e9


def agent_cpu(ranks: int, seconds: float, interval: str | None) -> float:
    """Percent of one core the agent used over the steady part of a run of ``ranks`` workers."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(WORKER)
        warmup = 4.0
        args = [sys.executable, "-m", "launcher", "--standalone", "--nproc-per-node", str(ranks)]
        if interval:
            args += ["--straggler-detection", "--straggler-interval", interval]
        process = subprocess.Popen([*args, str(script), str(warmup + seconds + 2)], env=_env(),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--compute", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ab-steps", type=int, default=2000)
    parser.add_argument("--watch-ranks", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    on, off = [], []
    for _ in range(args.rounds):  # alternated: a machine that slows down mid-run weighs on both alike
        off.append(step_ms(args.ranks, args.steps, args.compute, False))
        on.append(step_ms(args.ranks, args.steps, args.compute, True))
    results = {
        "step_ms": {
            "ranks": args.ranks, "steps": args.steps, "compute_s": args.compute,
            "off": [round(v, 3) for v in off], "on": [round(v, 3) for v in on],
            "slower_percent": round(100.0 * (statistics.median(on) / statistics.median(off) - 1.0), 2),
        },
        "ddp_step_us": hook_overhead_us(args.ranks, args.ab_steps),
        "collective_overhead_ns": round(collective_overhead_ns(), 1),
        "agent_cpu_percent": {
            "ranks": args.watch_ranks,
            "interval_5": round(agent_cpu(args.watch_ranks, args.seconds, "5"), 3),
            "interval_1": round(agent_cpu(args.watch_ranks, args.seconds, "1"), 3),
            "without": round(agent_cpu(args.watch_ranks, args.seconds, None), 3),
        },
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
