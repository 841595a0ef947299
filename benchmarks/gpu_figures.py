"""The GPU lane's figures, launcher beside torchrun, on the GPUs of this machine (NCCL).

Measured from the ranks' own timestamps (``tests/gpu/scripts/gpu_job.py``; the measurements are
``tests/gpu/lane.py``'s, the same the GPU tests run):

- start to every rank's first ``all_reduce`` (``--nproc-per-node gpu``): launcher, torchrun;
- a worker's failure to its replacement's first ``all_reduce`` (one worker, ``--max-restarts 1``,
  ``OMP_NUM_THREADS=1``): ``launcher --preload torch``, ``launcher``, torchrun;
- recovery in place (``launcher.recoverable``): a raise to the next call's first ``all_reduce``,
  beside torchrun's restart (what torchrun does instead);
- straggler timing's cost per DDP step (``benchmarks/bench_gpu_stragglers.py``).

``--reuse FILE`` takes figures the GPU tests already measured (``LAUNCHER_LANE_FIGURES``), so the
lane measures each once. Prints one table; ``--json`` writes it too. Without a CUDA device it says
so and exits 0; ``--device cpu --backend gloo`` runs the same measurements on CPU tensors (a try-out
of the script, not a GPU figure).

Usage::

    python benchmarks/gpu_figures.py [--runs 1] [--reuse FIGURES.jsonl] [--json FILE] [--only start,restart,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gpu import lane  # noqa: E402

#: What can be measured (``--only``).
PARTS = ("start", "restart", "in-place", "overhead")


def reused(path: str | None) -> dict[str, float]:
    """Figures the GPU tests recorded (name -> seconds); the last of a name wins."""
    found: dict[str, float] = {}
    if path and Path(path).exists():
        for row in lane.stamps(path):
            found[row["figure"]] = row["seconds"]
    return found


def median_of(runs: int, measure: Any) -> float:
    return statistics.median(measure(k)["seconds"] for k in range(runs))


def figures(options: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Each figure's seconds (or percent for the overhead), by name."""
    kept = reused(options.reuse)
    where = {"backend": options.backend, "device": options.device}
    parts = options.only.split(",")
    found: dict[str, Any] = {}

    def take(name: str, measure: Any) -> None:
        if name in kept:
            found[name] = {"seconds": kept[name], "source": "tests"}
            return
        started = time.monotonic()
        found[name] = {"seconds": round(median_of(options.runs, measure), 3), "source": f"{options.runs} run(s)"}
        print(f"gpu_figures: {name}: {found[name]['seconds']:.3f} s ({time.monotonic() - started:.0f} s to measure)",
              flush=True)

    if "start" in parts:
        for tool in ("launcher", "torchrun"):
            take(lane.START.format(tool), lambda k, tool=tool: lane.measure_start(tool, work / f"start-{tool}-{k}",
                                                                                   **where))
    if "restart" in parts:
        for name in lane.RESTARTS:
            take(lane.RESTART.format(name), lambda k, name=name: lane.measure_restart(
                name, work / f"restart-{name.replace(' ', '_')}-{k}", **where))
    if "in-place" in parts:
        take(lane.IN_PLACE, lambda k: lane.measure_in_place(work / f"in-place-{k}", **where))
    if "overhead" in parts:
        target = work / "overhead.json"
        command = [sys.executable, str(ROOT / "benchmarks" / "bench_gpu_stragglers.py"), "--json", str(target)]
        if options.device == "cpu":
            command += ["--cpu", "--widths", "256", "--blocks", "2", "--steps", "5"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        print(result.stdout, end="", flush=True)
        if result.returncode != 0:
            raise lane.JobFailed(f"bench_gpu_stragglers.py: exit {result.returncode}\n{result.stderr[-3000:]}")
        found["overhead"] = json.loads(target.read_text())
    return found


def table(found: dict[str, Any], header: str) -> list[str]:
    """The figures as lines: launcher beside torchrun, and the ratio."""
    lines = [header, f"{'':58} {'launcher':>9} {'torchrun':>9} {'ratio':>7}"]

    def row(label: str, ours: str, theirs: str) -> None:
        mine, other = found.get(ours), found.get(theirs)
        if mine is None:
            return
        a = f"{mine['seconds']:.3f}"
        b = f"{other['seconds']:.3f}" if other else "-"
        ratio = f"{mine['seconds'] / other['seconds']:.2f}x" if other and other["seconds"] else "-"
        lines.append(f"{label:58} {a:>9} {b:>9} {ratio:>7}")

    torchrun_restart = lane.RESTART.format("torchrun")
    row("start -> every rank's first all_reduce (s)", lane.START.format("launcher"), lane.START.format("torchrun"))
    row("failure -> replacement's first all_reduce, --preload torch", lane.RESTART.format("launcher --preload torch"),
        torchrun_restart)
    row("failure -> replacement's first all_reduce, plain", lane.RESTART.format("launcher"), torchrun_restart)
    row("in place: raise -> next call's first all_reduce", lane.IN_PLACE, torchrun_restart)
    overhead = found.get("overhead", {})
    if "skipped" in overhead:
        lines.append(f"straggler timing per DDP step: skipped ({overhead['skipped']})")
    for width, result in sorted(overhead.get("results", {}).items()):
        lines.append(f"straggler timing, DDP Linear({width}) step: {result['plain_ms']:.3f} -> {result['timed_ms']:.3f}"
                     f" ms ({result['overhead_percent']:+.2f} %; budget 1 %)")
    return lines


def load() -> str:
    try:
        with open("/proc/loadavg") as handle:
            return handle.read().split()[0]
    except OSError:
        return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of each measurement (the median is shown)")
    parser.add_argument("--reuse", help="figures the GPU tests recorded (a LAUNCHER_LANE_FIGURES file)")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--json", help="also write the figures to this file")
    options = parser.parse_args()
    unknown = set(options.only.split(",")) - set(PARTS)
    if unknown or options.runs < 1:
        print(f"gpu_figures: --only takes {', '.join(PARTS)} and --runs at least 1; got --only {options.only} "
              f"--runs {options.runs}", file=sys.stderr)
        return 2
    if options.device == "cuda" and lane.cuda_devices() == 0:
        print(f"gpu_figures: skipped: {lane.skip_reason()}; these figures need a GPU "
              "(--device cpu --backend gloo tries the script on CPU tensors)")
        document: dict[str, Any] = {"skipped": lane.skip_reason()}
    else:
        import torch

        card = torch.cuda.get_device_name(0) if options.device == "cuda" else "CPU (gloo; a try-out, not GPU figures)"
        header = (f"GPU lane figures on {card} ({lane.cuda_devices()} GPU(s), torch {torch.__version__}, "
                  f"{options.backend}); seconds, median of {options.runs} run(s) unless from the tests")
        with tempfile.TemporaryDirectory(prefix="gpu_figures_") as work:
            found = figures(options, Path(work))
        lines = table(found, header)
        lines.append(f"load average at the end: {load()}")
        print("\n".join(lines))
        document = {"device": card, "torch": torch.__version__, "backend": options.backend, "figures": found,
                    "table": lines}
    if options.json:
        Path(options.json).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
