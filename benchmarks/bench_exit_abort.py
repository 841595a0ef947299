"""The exit-time abort: a script that leaves its gloo process group alive, run again and again.

The worker script (as PyTorch's own test scripts do) joins a gloo group, ``all_reduce``\\s once,
prints its result and ends without ``destroy_process_group()``. As its interpreter shuts down, a
gloo thread can still be dropping its last reference to the collective; it cannot take the GIL any
more and dies in ``std::terminate``: SIGABRT, "terminate called without an active exception", after
the rank printed its result, and the job is reported failed (see docs/failures.md).

Each tool runs ``--standalone --nproc-per-node 2`` on that script, ``--runs`` times per case (50 by
default), from the same clean virtual environment (bench_venv.py), the cases taking turns run by
run so that load on the machine hits each alike:

- ``run_path``: ``launcher --run-path`` against ``torchrun --run-path`` (the script runs inside a
  function worker);
- ``script``: ``launcher`` against ``torchrun`` (``python -u script.py``);
- ``preload``: ``launcher --preload torch`` (script mode, but launcher's template runs the script;
  torchrun has no such mode: compare with its ``script`` figure).

For each case and tool: ``aborts`` (runs that failed with SIGABRT), ``other_failures`` (runs that
failed otherwise), ``all_printed`` (runs in which every rank printed its result) and the median wall
time of a run.

Usage: ``python benchmarks/bench_exit_abort.py [--runs 50] [--cases run_path script preload]
[--json benchmarks/results/exit_abort.json]``
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
from typing import Any

from bench_venv import ROOT, VENV, ensure_venv

NPROC = 2
TOOLS = ("launcher", "torchrun")
#: case: (what it is, each tool's extra flags); a tool without flags here does not run the case.
CASES: dict[str, tuple[str, dict[str, list[str]]]] = {
    "run_path": ("--run-path: the script runs in a function worker",
                 {"launcher": ["--run-path"], "torchrun": ["--run-path"]}),
    "script": ("script mode: python -u script.py", {"launcher": [], "torchrun": []}),
    "preload": ("script mode, workers forked from a template that preloaded torch (launcher only)",
                {"launcher": ["--preload", "torch"]}),
}

WORKER = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank())])
dist.all_reduce(value)
print(f"rank {dist.get_rank()} result {value.item():g}", flush=True)
"""


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}
    env["OMP_NUM_THREADS"] = "1"
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # cached bytecode, as on a user's machine
    return env


def run_once(tool: str, flags: list[str], script: Path) -> tuple[str, bool, float]:
    """One run: its outcome (``ok``, ``abort``, ``other``), whether every rank printed, its wall time."""
    start = time.monotonic()
    result = subprocess.run([str(VENV / "bin" / tool), "--standalone", "--nproc-per-node", str(NPROC), *flags,
                             str(script)], env=clean_env(), capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - start
    printed = all(f"rank {rank} result 1" in result.stdout for rank in range(NPROC))
    if result.returncode == 0:
        return "ok", printed, wall
    # launcher: "signal SIGABRT (6)"; torchrun: "Signal 6 (SIGABRT) received by PID ..." / exitcode -6.
    aborted = "SIGABRT" in result.stderr or "terminate called without an active exception" in result.stderr
    return ("abort" if aborted else "other"), printed, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--cases", nargs="*", choices=sorted(CASES))
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "exit_abort.json"))
    args = parser.parse_args()
    ensure_venv()
    cases = args.cases or list(CASES)
    runs = [(case, tool) for case in cases for tool in TOOLS if tool in CASES[case][1]]
    counts: dict[tuple[str, str], dict[str, Any]] = {
        run: {"ok": 0, "abort": 0, "other": 0, "all_printed": 0, "walls": []} for run in runs}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "leaves_its_group.py"
        script.write_text(WORKER)
        for number in range(args.runs):
            for case, tool in runs:  # taking turns, so drift hits each alike
                outcome, printed, wall = run_once(tool, CASES[case][1][tool], script)
                entry = counts[(case, tool)]
                entry[outcome] += 1
                entry["all_printed"] += printed
                entry["walls"].append(wall)
            if (number + 1) % 10 == 0:
                print(f"{number + 1} runs: " + ", ".join(f"{case} {tool} {counts[(case, tool)]['abort']} aborts"
                                                      for case, tool in runs), flush=True)
    results: dict[str, Any] = {}
    for case in cases:
        results[case] = {"title": CASES[case][0], "runs": args.runs}
        for tool in TOOLS:
            if (case, tool) not in counts:
                continue
            entry = counts[(case, tool)]
            results[case][tool] = {
                "aborts": entry["abort"],
                "other_failures": entry["other"],
                "succeeded": entry["ok"],
                "all_printed": entry["all_printed"],
                "median_wall_s": round(statistics.median(entry["walls"]), 3),
            }
            print(f"{case:9s} {tool:9s} aborts {entry['abort']:3d} / {args.runs}, other failures {entry['other']}, "
                  f"every rank printed in {entry['all_printed']}, median {statistics.median(entry['walls']):.2f} s")
    meta = {"nproc_per_node": NPROC, "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "venv": str(VENV), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(path.read_text()) if args.cases and path.exists() else {}
    existing.update(results)
    existing["meta" if not args.cases else f"meta_{'_'.join(cases)}"] = meta
    path.write_text(json.dumps(existing, indent=2) + "\n")
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
