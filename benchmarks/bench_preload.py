"""``--preload torch``: the first start and the restart of a 4-rank (or N-rank) job whose workers import torch.

Every worker's first statement is ``import torch``; it then writes its clock reading. Three tools
run the same script, from the same clean virtual environment (bench_venv.py), taking turns run by
run: ``launcher --preload torch``, plain ``launcher`` (for reference), and torchrun, each with
``--standalone --nproc-per-node 4``. Each figure is the median of ``--runs`` runs.

- ``first_start``: from invoking the command until every worker has imported torch
  (goal: launcher --preload torch <= 0.6x torchrun);
- ``restart``: from a worker's failing exit (rank 1, once every worker of the first attempt has
  imported torch) until every replacement worker has imported torch, with ``--max-restarts 1``
  (goal: <= 0.2x torchrun).

``--nproc-per-node 1`` measures the one-worker node (one GPU, one worker) as users run it: without
``OMP_NUM_THREADS`` (with more workers it is 1, as both tools set it), rank 0 failing, figures
written to ``benchmarks/results/preload-1.json``.

Usage: ``python benchmarks/bench_preload.py [--runs 7] [--only first_start restart]
[--nproc-per-node 4] [--json benchmarks/results/preload.json]``
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

WORKER = """
import torch
import os, sys, time
t = time.time()
out, scenario = sys.argv[1], sys.argv[2]
attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
with open(os.path.join(out, f"{attempt}_{rank}.tmp"), "w") as f:
    f.write(repr(t))
os.replace(os.path.join(out, f"{attempt}_{rank}.tmp"), os.path.join(out, f"{attempt}_{rank}"))
if scenario == "restart" and attempt == "0":
    if rank == ("1" if os.environ["WORLD_SIZE"] != "1" else "0"):
        while len([n for n in os.listdir(out) if n.startswith("0_") and not n.endswith(".tmp")]) < int(
                os.environ["LOCAL_WORLD_SIZE"]):
            time.sleep(0.005)
        with open(os.path.join(out, "failed"), "w") as f:
            f.write(repr(time.time()))
        os._exit(1)
    time.sleep(60)
"""

#: The figure each scenario compares, and its goal (launcher --preload torch over torchrun).
SCENARIOS = {
    "first_start": ("invoke -> every worker has imported torch", 0.6),
    "restart": ("failing exit -> every replacement has imported torch", 0.2),
}


def commands() -> dict[str, list[str]]:
    flags = ["--standalone", "--nproc-per-node", str(NPROC)]
    return {
        "preload": [str(VENV / "bin" / "launcher"), *flags, "--preload", "torch"],
        "launcher": [str(VENV / "bin" / "launcher"), *flags],
        "torchrun": [str(VENV / "bin" / "torchrun"), *flags],
    }


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}
    if NPROC > 1:
        env["OMP_NUM_THREADS"] = "1"
    else:  # one worker: neither tool sets it, and users seldom do
        env.pop("OMP_NUM_THREADS", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # cached bytecode, as on a user's machine
    return env


def measure(scenario: str, cmd: list[str], script: Path, work: Path) -> float:
    out = Path(tempfile.mkdtemp(dir=work))
    extra = ["--max-restarts", "1"] if scenario == "restart" else []
    start = time.time()
    result = subprocess.run([*cmd, *extra, str(script), str(out), scenario], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {result.stderr.decode()[-2000:]}")
    if b"--preload" in result.stderr:  # a fallback would measure the plain start under this name
        raise RuntimeError(f"--preload fell back: {result.stderr.decode()[-2000:]}")
    if scenario == "first_start":
        return max(float((out / f"0_{rank}").read_text()) for rank in range(NPROC)) - start
    failed = float((out / "failed").read_text())
    return max(float((out / f"1_{rank}").read_text()) for rank in range(NPROC)) - failed


def main() -> None:
    global NPROC
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    parser.add_argument("--nproc-per-node", type=int, default=NPROC, choices=range(1, 65), metavar="N")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    NPROC = args.nproc_per_node
    if args.json is None:
        name = "preload.json" if NPROC == 4 else f"preload-{NPROC}.json"
        args.json = str(ROOT / "benchmarks" / "results" / name)
    ensure_venv()
    tools = commands()
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        script = work / "torch_worker.py"
        script.write_text(WORKER)
        for scenario in args.only or SCENARIOS:
            title, goal = SCENARIOS[scenario]
            for cmd in tools.values():  # warm the page cache before timing
                measure(scenario, cmd, script, work)
            samples: dict[str, list[float]] = {tool: [] for tool in tools}
            for _ in range(args.runs):
                for tool, cmd in tools.items():  # taking turns, so drift hits each alike
                    samples[tool].append(measure(scenario, cmd, script, work))
            medians = {tool: statistics.median(values) for tool, values in samples.items()}
            results[scenario] = {
                "title": title,
                "unit": "s",
                **{f"{tool}_median": round(value, 4) for tool, value in medians.items()},
                "ratio": round(medians["preload"] / medians["torchrun"], 3),
                "launcher_without_preload_ratio": round(medians["launcher"] / medians["torchrun"], 3),
                "target_ratio": goal,
                "runs": args.runs,
                **{f"{tool}_samples": [round(x, 4) for x in values] for tool, values in samples.items()},
            }
            print(f"{scenario:12s} --preload torch {medians['preload']:7.3f} s | launcher {medians['launcher']:7.3f} s"
                  f" | torchrun {medians['torchrun']:7.3f} s | ratio {medians['preload'] / medians['torchrun']:.3f}"
                  f" (goal <= {goal})", flush=True)
    meta = {"nproc_per_node": NPROC, "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(path.read_text()) if args.only and path.exists() else {}
    existing.update(results)
    existing["meta"] = meta
    path.write_text(json.dumps(existing, indent=2) + "\n")
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
