"""launcher's start-up against the floor (floor.py: a bare Python process starting 4 Python workers)
and against torchrun.

All three start the same no-op worker 4 times (``--standalone --nproc-per-node 4`` for the two
launchers), from the same clean virtual environment (bench_venv.py) and the same environment
(``OMP_NUM_THREADS=1``, bytecode cached), taking turns run by run so that drift on a shared machine
hits each alike. The figure is the time from invoking the command to the last worker's first
line, read from the workers' own clocks; each is the median of ``--runs`` runs. The goal is
launcher <= 1.5x the floor.

``--explain`` also runs launcher once under ``python -X importtime`` and prints where its own
start-up goes: the import time of each top-level package and the costliest modules; then, measured
in-process without ``importtime``'s overhead, the time until the first worker starts, how much of
it is importing modules, and how much of that is creating dataclasses.

``--bounds`` adds the floor program after importing only standard modules any Python launcher needs
(``floor_imports.py``), then those plus ``typing`` and ``dataclasses``, then plus ``pluggy``: what a
launcher that did nothing else would cost, so the goal can be read against what Python itself charges.

``--base REV`` runs another revision's launcher beside this checkout's, in the same run, taking turns
(``revisions.py``: its ``core`` first on ``PYTHONPATH``; both then run as ``python -m launcher``).
``--plugins`` installs the repository's plugin distributions (etcd, nodecheck, webhook) for both, as a
site with them installed would have them.

Usage: ``python benchmarks/bench_floor.py [--runs 15] [--explain] [--bounds] [--base REV] [--plugins]
[--json benchmarks/results/floor.json]``
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
from collections import defaultdict
from pathlib import Path

from bench_venv import ROOT, VENV, ensure_venv
from revisions import commit_of, extract, plugin_site, tree_env

NPROC = 4
GOAL = 1.5
#: In-process start-up probes for ``--explain`` (the median is shown).
PROBES = 9

NOOP = """
import time
t = time.time()
import os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    f.write(repr(t))
"""


#: ``--bounds``: the floor after these imports (cumulative).
STDLIB = "subprocess,selectors,socket,threading,signal,logging,argparse"
BOUNDS = {
    "floor+stdlib": STDLIB,
    "floor+stdlib+typing,dataclasses": f"{STDLIB},typing,dataclasses",
    "floor+stdlib+typing,dataclasses+pluggy": f"{STDLIB},typing,dataclasses,pluggy",
}


#: A tool: its command and the environment it runs in.
Tool = tuple[list[str], dict[str, str]]


def commands(python: Path, bounds: bool = False, base: tuple[str, Path] | None = None,
             site: Path | None = None) -> dict[str, Tool]:
    """The tools, each with its environment. ``base``: (revision, its extracted tree), run beside
    this checkout; ``site``: the plugins installed (``revisions.plugin_site``)."""
    flags = ["--standalone", "--nproc-per-node", str(NPROC)]
    env = clean_env()
    tools: dict[str, Tool] = {"floor": ([str(python), str(ROOT / "benchmarks" / "floor.py"), str(NPROC)], env)}
    if base is not None:  # both the same way: python -m launcher, each tree first on PYTHONPATH
        tools["launcher"] = ([str(python), "-m", "launcher", *flags], tree_env(env, ROOT, site))
        tools[f"launcher@{base[0]}"] = ([str(python), "-m", "launcher", *flags], tree_env(env, base[1], site))
    else:
        tools["launcher"] = ([str(VENV / "bin" / "launcher"), *flags], tree_env(env, ROOT, site) if site else env)
    tools["torchrun"] = ([str(VENV / "bin" / "torchrun"), *flags], env)
    if bounds:
        for name, modules in BOUNDS.items():
            tools[name] = ([str(python), str(ROOT / "benchmarks" / "floor_imports.py"), modules, str(NPROC)], env)
    return tools


#: Run in the venv's Python: launcher's command line, in-process, until its first worker starts:
#: how long that takes (after the interpreter's own start), how much of it is importing modules
#: (each outermost import, timed by wrapping importlib's loader entry point), and how much is
#: creating dataclasses (which happens inside those imports).
_START_PROBE = """
import time
began = time.perf_counter()
import dataclasses, importlib._bootstrap as bootstrap, sys  # launcher imports dataclasses too
spent, started, imports, depth = [0.0, 0], [], [time.perf_counter() - began], [0]
script, out = sys.argv[1], sys.argv[2]
create = dataclasses._process_class
def timed(cls, *args):
    begin = time.perf_counter()
    try:
        return create(cls, *args)
    finally:
        if not started:
            spent[0] += time.perf_counter() - begin
            spent[1] += 1
dataclasses._process_class = timed
load = bootstrap._find_and_load
def timed_import(name, import_):
    depth[0] += 1
    begin = time.perf_counter()
    try:
        return load(name, import_)
    finally:
        depth[0] -= 1
        if depth[0] == 0 and not started:
            imports[0] += time.perf_counter() - begin
bootstrap._find_and_load = timed_import
def first_worker(event, args):
    if event == "subprocess.Popen" and script in args[1] and not started:
        started.append(time.perf_counter() - began)
sys.addaudithook(first_worker)
from launcher.cli import main
try:
    main(["--standalone", "--nproc-per-node", sys.argv[3], script, out])
finally:
    import json
    print(json.dumps({"ms": round(spent[0] * 1000, 1), "classes": spent[1],
                      "to_first_worker_ms": round(started[0] * 1000, 1),
                      "imports_ms": round(imports[0] * 1000, 1)}), file=sys.__stderr__)
"""


def start_probe(python: Path, script: Path, work: Path, env: dict[str, str]) -> dict[str, float]:
    """In-process milliseconds until launcher's first worker starts, importing modules and creating
    dataclasses in that time, and how many dataclasses."""
    result = subprocess.run([str(python), "-c", _START_PROBE, str(script), str(work), str(NPROC)],
                            env=env, capture_output=True, text=True, timeout=300)
    return dict(json.loads(result.stderr.strip().splitlines()[-1]))


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}
    env["OMP_NUM_THREADS"] = "1"
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # cached bytecode, as on a user's machine
    return env


def measure(tool: Tool, script: Path, work: Path) -> float:
    """Seconds from invoking the tool's command to the last worker's first line."""
    cmd, env = tool
    out = Path(tempfile.mkdtemp(dir=work))
    start = time.time()
    result = subprocess.run([*cmd, str(script), str(out)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {result.stderr.decode()[-2000:]}")
    return max(float((out / str(rank)).read_text()) for rank in range(NPROC)) - start


def explain(python: Path, script: Path, work: Path, env: dict[str, str]) -> dict[str, object]:
    """Import time of launcher's start-up by top-level package, and the costliest modules (ms),
    in ``env`` (this checkout's launcher's)."""
    result = subprocess.run([str(python), "-X", "importtime", "-m", "launcher", "--standalone", "--nproc-per-node",
                             str(NPROC), str(script), str(work)], env=env, capture_output=True, text=True,
                            timeout=300)
    by_package: dict[str, float] = defaultdict(float)
    modules: list[tuple[float, str]] = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        self_us, _cumulative, name = line[len("import time:"):].split("|")
        name = name.strip()
        by_package[name.split(".")[0]] += int(self_us) / 1000
        modules.append((int(self_us) / 1000, name))
    total = sum(by_package.values())
    print(f"\nlauncher's imports: {total:.1f} ms in all (-X importtime inflates every figure somewhat)")
    for package, ms in sorted(by_package.items(), key=lambda item: -item[1])[:12]:
        print(f"  {ms:7.1f} ms  {package}")
    print("costliest modules (own time):")
    for ms, name in sorted(modules, reverse=True)[:15]:
        print(f"  {ms:7.1f} ms  {name}")
    probes = [start_probe(python, script, work, env) for _ in range(PROBES)]
    probe = {key: statistics.median(p[key] for p in probes) for key in probes[0]}
    print(f"in-process, until the first worker starts (median of {PROBES}, no importtime): "
          f"{probe['to_first_worker_ms']:.1f} ms, of which importing modules {probe['imports_ms']:.1f} ms "
          f"(creating {probe['classes']:.0f} dataclasses {probe['ms']:.1f} ms of it), the rest "
          f"{probe['to_first_worker_ms'] - probe['imports_ms']:.1f} ms")
    dataclasses = {"ms": probe["ms"], "classes": probe["classes"]}
    return {"imports_ms": round(total, 1), "dataclasses_before_first_worker": dataclasses,
            "to_first_worker_ms": probe["to_first_worker_ms"], "importing_before_first_worker_ms": probe["imports_ms"],
            "by_package_ms": {k: round(v, 1) for k, v in sorted(by_package.items(), key=lambda i: -i[1])[:12]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--explain", action="store_true", help="also show where launcher's start-up goes")
    parser.add_argument("--bounds", action="store_true",
                        help="also time the floor after the imports any Python launcher pays (floor_imports.py)")
    parser.add_argument("--base", help="also run this git revision's launcher, taking turns (A/B in one run)")
    parser.add_argument("--plugins", action="store_true",
                        help="install the repository's plugin distributions for launcher (both revisions)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "floor.json"))
    args = parser.parse_args()
    python = ensure_venv()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        site = plugin_site(work / "site") if args.plugins else None
        base = (args.base, extract(args.base, work / "base")) if args.base else None
        tools = commands(python, args.bounds, base, site)
        samples: dict[str, list[float]] = {tool: [] for tool in tools}
        script = work / "noop.py"
        script.write_text(NOOP)
        for cmd in tools.values():  # warm the page cache (and compile bytecode) before timing
            measure(cmd, script, work)
        for _ in range(args.runs):
            for tool, cmd in tools.items():
                samples[tool].append(measure(cmd, script, work))
        explained = explain(python, script, work, tools["launcher"][1]) if args.explain else None
    medians = {tool: statistics.median(values) for tool, values in samples.items()}
    results: dict[str, object] = {
        "title": f"{NPROC} no-op workers: invoke -> last worker's first line",
        "unit": "s",
        **{f"{tool}_median": round(value, 4) for tool, value in medians.items()},
        **{f"{tool}_over_floor": round(value / medians["floor"], 3) for tool, value in medians.items()
           if tool in BOUNDS},
        "launcher_over_floor": round(medians["launcher"] / medians["floor"], 3),
        "torchrun_over_floor": round(medians["torchrun"] / medians["floor"], 3),
        "launcher_over_torchrun": round(medians["launcher"] / medians["torchrun"], 3),
        **({f"launcher@{args.base}_over_floor": round(medians[f"launcher@{args.base}"] / medians["floor"], 3),
            f"launcher@{args.base}_over_torchrun": round(medians[f"launcher@{args.base}"] / medians["torchrun"], 3)}
           if args.base else {}),
        "plugins": args.plugins,
        **({"base_commit": commit_of(args.base), "this_commit": commit_of("HEAD")} if args.base else {}),
        "goal_launcher_over_floor": GOAL,
        "runs": args.runs,
        **{f"{tool}_samples": [round(x, 4) for x in values] for tool, values in samples.items()},
    }
    if explained is not None:
        results["explain"] = explained
    width = max(len(tool) for tool in medians)
    print(f"\n{'tool':{width}s} | {'median':>9s} | over the floor")
    for tool, value in medians.items():
        print(f"{tool:{width}s} | {value * 1000:7.1f}ms | {value / medians['floor']:.2f}x"
              + (f" (goal <= {GOAL}x)" if tool == "launcher" else "")
              + (f", {value / medians['torchrun']:.3f}x torchrun" if tool.startswith("launcher") else ""))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results["meta"] = {"nproc_per_node": NPROC, "python": sys.version.split()[0], "cpus": os.cpu_count(),
                       "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "load_average": [round(x, 2) for x in os.getloadavg()]}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {args.json}")


if __name__ == "__main__":
    main()
