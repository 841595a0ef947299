"""Start-up of this checkout's launcher against another revision's, in one run (A/B).

The other revision's ``core/`` is extracted with ``git archive`` into a temporary directory and
put first on ``PYTHONPATH``; this checkout's runs the same way, from the same interpreter and
environment. The two take turns run by run, so drift on a shared machine hits both alike. Two
figures, each the median of ``--runs`` runs:

- ``first worker``: from invoking ``launcher --standalone --nproc-per-node 1 noop.py`` to the
  worker's first line, read from the worker's own clock;
- ``--help``: the whole ``launcher --help`` command.

The minimum is printed too: on a busy machine it is the steadier figure.

Usage: ``python benchmarks/bench_startup_ab.py --base REV [--runs 20]`` (run from the checkout,
with an interpreter that has launcher's dependencies, e.g. ``.tox/py3/bin/python``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOOP = "import sys, time\nopen(sys.argv[1], 'w').write(repr(time.time()))\n"


def _env(core: Path) -> dict[str, str]:
    # Bytecode written and then used, as in any installed launcher: a PYTHONDONTWRITEBYTECODE left
    # in the environment would compile every module of every run and measure the compiler.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(core), OMP_NUM_THREADS="1")
    return env


def first_worker(core: Path, script: Path, out: Path) -> float:
    """Seconds from invoking the launcher to the worker's first line."""
    out.unlink(missing_ok=True)
    started = time.time()
    subprocess.run([sys.executable, "-m", "launcher", "--standalone", "--nproc-per-node", "1", str(script), str(out)],
                   env=_env(core), check=True, capture_output=True, timeout=120)
    return float(out.read_text()) - started


def help_time(core: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "launcher", "--help"], env=_env(core), check=True, capture_output=True,
                   timeout=60)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base, "core"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        script, out = Path(tmp) / "noop.py", Path(tmp) / "out"
        script.write_text(NOOP)
        cores = {args.base: base / "core", "this checkout": ROOT / "core"}
        for core in cores.values():  # bytecode compiled and caches warm before measuring
            first_worker(core, script, out)
            help_time(core)
        results: dict[str, dict[str, list[float]]] = {name: {"first worker": [], "--help": []} for name in cores}
        for _ in range(args.runs):
            for name, core in cores.items():
                results[name]["first worker"].append(first_worker(core, script, out))
                results[name]["--help"].append(help_time(core))
    print(f"median (minimum) of {args.runs} runs, alternating, in ms")
    for name, figures in results.items():
        cells = ", ".join(f"{what} {statistics.median(times) * 1000:.1f} ({min(times) * 1000:.1f})"
                          for what, times in figures.items())
        print(f"  {name:>14}: {cells}")


if __name__ == "__main__":
    main()
