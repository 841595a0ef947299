"""Recovery in place of one rank that raises: raise to the next call's first all-reduce, on CPU (gloo).

One agent, ``--standalone --nproc-per-node 1`` (the one-GPU case of issue 38), the training function
under ``launcher.recoverable``: its first call raises after one all-reduce, its second makes a new
process group and all-reduces once. Measured inside the worker (``time.monotonic``): seconds from the
raise until the function is called again, and until that call's first all-reduce is done.

``--abort-delay SECONDS`` makes each process group's ``abort()`` take that long before doing the real
abort: what NCCL's abort costs (it joins NCCL's own threads; about 1 s on an H100). With the abort
waited for, the delay adds to the recovery; without, it does not. The delay is a stand-in, not NCCL.

Writes ``benchmarks/results/recovery_abort.json``.

Usage::

    .tox/py3/bin/python benchmarks/bench_recovery_abort.py [--repeat 5] [--abort-delays 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, os, sys, time
import torch, torch.distributed as dist
import launcher

out, delay = sys.argv[1], float(sys.argv[2])
if delay:
    real_abort = dist.ProcessGroup.abort

    def slow_abort(group):
        time.sleep(delay)
        real_abort(group)

    dist.ProcessGroup.abort = slow_abort
marks = {}

@launcher.recoverable
def train():
    first = "raised" not in marks
    if not first:
        marks["called again"] = time.monotonic()
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(4))
    if first:
        marks["raised"] = time.monotonic()
        raise RuntimeError("the first call fails")
    marks["first all_reduce"] = time.monotonic()
    dist.destroy_process_group()

train()
with open(out, "w") as handle:
    json.dump({"to_call": marks["called again"] - marks["raised"],
               "to_all_reduce": marks["first all_reduce"] - marks["raised"]}, handle)
"""


def once(delay: float, workdir: Path, index: int) -> dict[str, float]:
    script = workdir / "job.py"
    script.write_text(SCRIPT)
    out = workdir / f"result.{delay}.{index}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}
    subprocess.run([sys.executable, "-m", "launcher", "--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
                    str(script), str(out), str(delay)], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300)
    return dict(json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--abort-delays", default="0,1")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for delay in [float(d) for d in args.abort_delays.split(",")]:
            runs = [once(delay, Path(tmp), i) for i in range(args.repeat)]
            results[f"{delay:g}"] = {key: round(statistics.median(r[key] for r in runs), 4)
                                     for key in ("to_call", "to_all_reduce")}
            print(f"abort delay {delay:g} s: raise -> called again {results[f'{delay:g}']['to_call']:.3f} s, "
                  f"-> first all_reduce {results[f'{delay:g}']['to_all_reduce']:.3f} s (median of {args.repeat})",
                  flush=True)
    load = os.getloadavg()[0]
    (ROOT / "benchmarks" / "results" / "recovery_abort.json").write_text(
        json.dumps({"repeat": args.repeat, "load_1min": round(load, 2), "cpus": os.cpu_count(),
                    "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
