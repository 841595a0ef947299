"""Health checks: what the default checks cost before the first worker, on a healthy CPU node.

Three commands run the same one-worker script (``--standalone --nproc-per-node 1``), taking turns
run by run: ``launcher`` with its default checks (``gpu``, ``disk``, ``python``, ``command``:
here gpu is skipped, there being no NVIDIA driver, and command has no ``--health-check-cmd``),
the same with ``--health-checks none``, and torchrun. The worker writes its clock reading as its
first statement; each figure is the median, over ``--runs`` runs, of invoke -> that reading.

- ``launch_default`` / ``launch_none`` / ``torchrun``: the three launches;
- ``checks_cost``: ``launch_default - launch_none`` (goal: under 50 ms);
- ``checks_in_process``: the default checks alone, run in this process as the agent runs them
  (:func:`launcher.health.runner.run_checks`), the median of the same number of runs, with each
  check's own median.

``--base REV`` also runs another revision's two launches (``launch_default@REV``, ``launch_none@REV``),
taking turns with the rest (``revisions.py``; every launcher then runs with its tree's ``core`` first
on ``PYTHONPATH``): A/B in one run.

Usage: ``python benchmarks/bench_health.py [--runs 7] [--base REV] [--json benchmarks/results/health.json]``
(run it with the interpreter of an environment holding launcher and torch, e.g. ``.tox/py3/bin/python``).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revisions import ROOT, commit_of, extract, tree_env  # noqa: E402

GOAL_MS = 50.0

WORKER = """
import time
t = time.time()
import os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    f.write(repr(t))
"""


def _commands(script: str, out: str, base: tuple[str, Path] | None = None) -> dict[str, tuple[list[str], dict]]:
    flags = ["--standalone", "--nproc-per-node", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}
    trees = {"": tree_env(env, ROOT) if base else env}
    if base is not None:
        trees[f"@{base[0]}"] = tree_env(env, base[1])
    commands: dict[str, tuple[list[str], dict]] = {}
    for suffix, tree in trees.items():
        commands[f"launch_default{suffix}"] = ([sys.executable, "-m", "launcher", *flags, script, out], tree)
        commands[f"launch_none{suffix}"] = (
            [sys.executable, "-m", "launcher", *flags, "--health-checks", "none", script, out], tree)
    commands["torchrun"] = ([sys.executable, "-m", "torch.distributed.run", *flags, script, out], env)
    return commands


def _one(command: tuple[list[str], dict], out: Path) -> float:
    argv, env = command
    for name in os.listdir(out):
        os.unlink(out / name)
    started = time.time()
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=120)
    return (float((out / "0").read_text()) - started) * 1000.0


def _in_process(script: str, runs: int) -> dict[str, float]:
    from launcher.agent.group import Entrypoint
    from launcher.health.plan import build_health_plan
    from launcher.health.runner import run_checks
    from launcher.health.settings import HealthSettings
    from launcher.plugins.manager import get_plugin_manager

    plan = build_health_plan(HealthSettings(), get_plugin_manager(autoload=False), node="bench",
                             entry=Entrypoint(command=[sys.executable, "-u", script]), env=dict(os.environ),
                             log_dir=None, preload=(), nproc_per_node=1, device_provider=None)
    assert plan is not None
    totals, each = [], {c.name: [] for c in plan.checks}
    for _ in range(runs):
        started = time.perf_counter()
        outcomes = run_checks(plan.checks, plan.context)
        totals.append((time.perf_counter() - started) * 1000.0)
        for outcome in outcomes:
            assert not outcome.result.is_sick, outcome
            each[outcome.name].append(outcome.seconds * 1000.0)
    figures = {"checks_in_process": statistics.median(totals)}
    figures.update({f"check_{name}": statistics.median(values) for name, values in each.items()})
    statuses = {o.name: o.result.status for o in outcomes}
    print("  statuses: " + ", ".join(f"{k}={v}" for k, v in statuses.items()))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--base", help="also run this git revision's launches, taking turns (A/B in one run)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        Path(script).write_text(WORKER)
        out = Path(tmp) / "out"
        out.mkdir()
        base = (args.base, extract(args.base, Path(tmp) / "base")) if args.base else None
        commands = _commands(script, str(out), base)
        for argv in commands.values():  # warm the page cache once
            _one(argv, out)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, argv in commands.items():
                samples[name].append(_one(argv, out))
        figures = {name: statistics.median(values) for name, values in samples.items()}
        figures["checks_cost"] = figures["launch_default"] - figures["launch_none"]
        if base is not None:
            figures[f"checks_cost@{args.base}"] = (figures[f"launch_default@{args.base}"]
                                                   - figures[f"launch_none@{args.base}"])
        figures.update(_in_process(script, args.runs))
    for name, value in figures.items():
        print(f"{name:>20}: {value:8.1f} ms")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    verdict = "met" if figures["checks_cost"] < GOAL_MS else "NOT met"
    print(f"goal: the default checks cost < {GOAL_MS:g} ms before the first worker: {verdict}")
    if args.json is not None:
        commits = {"base_commit": commit_of(args.base), "this_commit": commit_of("HEAD")} if args.base else {}
        args.json.write_text(json.dumps({"runs": args.runs, "unit": "ms", "figures": figures, **commits,
                                         "load_average": [round(x, 2) for x in os.getloadavg()]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
