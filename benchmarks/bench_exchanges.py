"""What each cross-node exchange costs a node in store requests and bytes, before issue 40 and after.

For each size (``--sizes``, default 64, 256, 1024) and each exchange, simulated nodes, one real
store client (socket) each, run the exchange against a real store server
(:mod:`launcher.testing.exchanges`, each size in a fresh process):

- ``stragglers``: per interval, after enough intervals for a verdict naming one rank (8 ranks a
  node, about 1.6 KB a node's summary key);
- ``hangs``: per hang, every node on a thread of its own (8 hung ranks a node).

``before`` is main's algorithm before issue 40 (every node reads every node's key), run from a
git worktree of ``--main-ref`` (main before issue 40, 8f3f8ef) made under ``/tmp`` (``--main``
names an existing checkout instead); ``after`` is this tree's. A run taking more than ``--limit``
seconds is given up and printed as such. Printed per node: requests and bytes (the mean over the
nodes that neither judge nor merge), the judging/merging node's, and the total through the store
host.

Usage: ``python benchmarks/bench_exchanges.py [--sizes 64,256,1024] [--json benchmarks/results/exchanges.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "core" / "launcher" / "testing" / "exchanges.py"


def main_checkout(ref: str) -> Path:
    """A worktree of ``ref`` under /tmp (made once, reused)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], check=True, capture_output=True,
                            text=True).stdout.strip()
    path = Path("/tmp") / f"launcher-main-{commit[:12]}"
    if not (path / "core" / "launcher").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit], check=True,
                       capture_output=True)
    return path


def measure(core: Path, kind: str, n: int, limit: float) -> dict | None:
    env = dict(os.environ, PYTHONPATH=str(core))
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, str(DRIVER), kind, str(n)], env=env, capture_output=True, text=True,
                              timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        raise SystemExit(f"{kind} at {n} nodes failed:\n{done.stderr[-2000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["seconds"] = round(time.monotonic() - started, 1)
    return figures


def figures(n: int, limit: float = 300.0) -> dict[str, dict | None]:
    """Each exchange's figures at ``n`` nodes with this tree's algorithm (``None``: more than
    ``limit`` seconds), for ``benchmarks/bench_scale.py``; main's algorithm is measured by this
    file's own run (it needs a worktree of main)."""
    return {kind: measure(ROOT / "core", kind, n, limit) for kind in ("stragglers", "hangs")}


def _kb(value: float) -> str:
    return f"{value / 1024:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--main", type=Path, help="a checkout of main before issue 40 (default: --main-ref's)")
    # main before the exchanges of issue 40 were aggregated
    parser.add_argument("--main-ref", default="8f3f8ef6a88e18ab7727a1fc701594769c5be2c3")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds one measurement may take")
    parser.add_argument("--before-up-to", type=int, default=1024,
                        help="measure main's algorithm up to this many nodes (it is O(nodes^2) in all)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    before_root = args.main or main_checkout(args.main_ref)
    load = os.getloadavg()
    print(f"# {os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; before: {before_root}")
    header = (f"{'exchange':<11}{'nodes':>6} {'algorithm':<7}{'req/node':>9}{'KB/node':>10}{'judge req':>10}"
              f"{'judge KB':>10}{'total MB':>10}{'seconds':>8}")
    print(header)
    results = []
    for kind in ("stragglers", "hangs"):
        for n in [int(s) for s in args.sizes.split(",")]:
            for algorithm, core in (("before", before_root / "core"), ("after", ROOT / "core")):
                if algorithm == "before" and n > args.before_up_to:
                    continue
                figures = measure(core, kind, n, args.limit)
                results.append({"exchange": kind, "nodes": n, "algorithm": algorithm, "figures": figures})
                if figures is None:
                    print(f"{kind:<11}{n:>6} {algorithm:<7}  (more than {args.limit:.0f} s: not measured)")
                    continue
                print(f"{kind:<11}{n:>6} {algorithm:<7}{figures['node_requests']:>9.1f}{_kb(figures['node_bytes']):>10}"
                      f"{figures['judge_requests']:>10.0f}{_kb(figures['judge_bytes']):>10}"
                      f"{figures['total_bytes'] / 1e6:>10.1f}{figures['seconds']:>8.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"cores": os.cpu_count(), "load": load, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
