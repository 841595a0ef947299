"""From a hang to its report: ``--hang-timeout auto`` beside a fixed ``--hang-timeout`` (issue 46).

The same job each time: a plain DDP loop over gloo (2 ranks, no launcher call, a step of about
``--step`` seconds), whose rank 1 blocks in its data loading at step ``--block-at`` (after the 60
intervals ``auto`` learns its first steady timeout from). Rank 1 writes the wall-clock time just
before it blocks; the launcher's stderr is read line by line and stamped as it comes. Measured, per
configuration:

- ``detect_s``: from the block to the line ``launcher: hang detected by ...`` (the report);
- ``exit_s``: from the block to the launcher's exit (the report printed, the workers stopped);
- ``learned_steady_s``: the steady timeout ``auto`` had learned (its last INFO line).

Configurations, one after the other in one run: ``auto`` with its defaults (floor 60 s),
``auto --hang-floor 10`` (what the learned value itself gives for a job of fast steps), and
a fixed ``--hang-timeout 30``. ``--configs`` picks some.

Usage: ``python benchmarks/bench_hang_report.py [--step 0.05] [--block-at 100] [--configs auto,auto-floor10,fixed30]
[--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

JOB = r"""
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

step_s, block_at, marker = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100000):
    if step == block_at and rank == 1:
        with open(marker, "w") as handle:
            handle.write(repr(time.time()))
        while True:  # a data loader reading from a dead mount
            time.sleep(1)
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(step_s)
"""

CONFIGS = {
    "auto": ["--hang-timeout", "auto"],
    "auto-floor10": ["--hang-timeout", "auto", "--hang-floor", "10"],
    "fixed30": ["--hang-timeout", "30"],
}


def run(name: str, step: float, block_at: int, folder: str) -> dict:
    script = os.path.join(folder, "job.py")
    Path(script).write_text(JOB)
    marker = os.path.join(folder, f"blocked.{name}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "core"), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "launcher", "--standalone", "--nproc-per-node", "2", *CONFIGS[name], script,
               str(step), str(block_at), marker]
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process.wait(timeout=900)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    ended = time.time()
    reader.join(timeout=10)
    blocked = float(Path(marker).read_text()) if os.path.exists(marker) else None
    detected = next(((when, line) for when, line in lines if line.startswith("launcher: hang detected by")), None)
    learned = [float(m.group(1)) for _, line in lines
               if (m := re.search(r"hang timeout \(steady\) learned: ([\d.]+) s", line))]
    result = {
        "config": name,
        "flags": " ".join(CONFIGS[name]),
        "exit_code": process.returncode,
        "blocked_after_s": round(blocked - started, 2) if blocked else None,
        "detect_s": round(detected[0] - blocked, 2) if detected and blocked else None,
        "exit_s": round(ended - blocked, 2) if blocked else None,
        "learned_steady_s": learned[-1] if learned else None,
        "reason": detected[1].split(": ", 2)[-1] if detected else None,
    }
    if detected is None:
        result["stderr_tail"] = [line for _, line in lines[-20:]]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=float, default=0.05, help="seconds each step sleeps (default 0.05)")
    parser.add_argument("--block-at", type=int, default=100, help="the step rank 1 blocks at (default 100)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"some of {', '.join(CONFIGS)}")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.configs.split(","):
            result = run(name, args.step, args.block_at, folder)
            results.append(result)
            print(f"{name:14} {result['flags']:40} detected {result['detect_s']} s after the block, "
                  f"exit {result['exit_s']} s (learned steady: {result['learned_steady_s']}); {result['reason']}",
                  flush=True)
    figures = {"machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()[0]},
               "step_s": args.step, "block_at": args.block_at, "results": results}
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
