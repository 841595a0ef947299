"""The GPU lane in one command: build launcher's wheel, install it alone, run ``pytest -m gpu tests/gpu``
and print the figures beside torchrun's.

For a one-GPU machine with torch (and pytest, setuptools, pluggy) preinstalled and no network, as
the GPU machines at hand are (docs/gpu-lane.md)::

    python3 benchmarks/gpu_lane.py [--out DIR]

1. builds the ``launcher-core`` wheel from a copy of this tree (``pip wheel --no-deps
   --no-build-isolation --no-index``: nothing is downloaded);
2. installs it with ``--no-index --no-deps --target`` into a temporary directory and checks that
   ``import launcher`` finds it there (not this tree);
3. runs ``pytest -m gpu tests/gpu`` against that install (skipped, not failed, where torch sees no
   CUDA device);
4. runs ``benchmarks/gpu_figures.py`` (reusing what the tests measured) and prints its table.
   Without a GPU it runs the figure script's CPU try-out instead (gloo on CPU tensors), so every
   step but the GPU's own is exercised anywhere.

Results go to ``--out``, else ``$OUT`` when set, else a new temporary directory: ``lane.json``
(the summary), ``pytest.log``, ``figures.jsonl`` (what the tests measured), ``figures.json`` and
``nvml_capture.json`` (the real driver's answers, for ``tests/health``). Exit status 0 when the
tests passed or were skipped, 1 when a step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Not copied into the build: caches, environments, earlier builds.
SKIP = shutil.ignore_patterns(".git", ".tox", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              ".mypy_cache", ".ruff_cache", ".pytest_cache", "site", "results")
#: Seconds each step may take (the lane's budget is 5 minutes on a one-GPU machine).
TIMEOUTS = {"build": 180, "install": 120, "pytest": 420, "figures": 300}
_STARTED = time.monotonic()


class StepFailed(Exception):
    """A step of the lane failed: the message says which and why."""


def step(what: str) -> None:
    print(f"gpu_lane: [{time.monotonic() - _STARTED:5.1f} s] {what}", flush=True)


def run(name: str, command: list[str], *, cwd: Path, env: dict[str, str] | None = None,
        log: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run one step's command; its output goes to ``log`` (and the console) when given."""
    try:
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUTS[name])
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"{name} took more than {TIMEOUTS[name]} s: {' '.join(command)}") from exc
    if log is not None:
        log.write_text(result.stdout + result.stderr)
    return result


def build_wheel(work: Path) -> Path:
    """launcher-core's wheel, built from a copy of the tree without touching the network."""
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=SKIP, symlinks=True)
    wheels = work / "wheels"
    result = run("build", [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--wheel-dir", str(wheels), str(source)], cwd=work)
    built = sorted(wheels.glob("launcher_core-*.whl"))
    if result.returncode != 0 or len(built) != 1:
        output = result.stdout + result.stderr
        if "invalid command 'bdist_wheel'" in output:
            raise StepFailed(f"building the wheel failed: {sys.executable}'s setuptools cannot build wheels by itself;"
                             " it needs the wheel package, or setuptools 70.1 or later")
        raise StepFailed(f"building the wheel failed (exit {result.returncode}; it needs setuptools>=64):\n"
                         f"{output[-3000:]}")
    return built[0]


def install(wheel: Path, work: Path) -> dict[str, str]:
    """The wheel installed alone into ``work/site``; the environment that uses it."""
    site = work / "site"
    result = run("install", [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                             "--no-compile", "--target", str(site), str(wheel)], cwd=work)
    if result.returncode != 0:
        raise StepFailed(f"installing {wheel.name} failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env["PATH"] = os.pathsep.join([str(site / "bin"), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    probe = run("install", [sys.executable, "-c", "import launcher, pluggy; print(launcher.__file__)"], cwd=work,
                env=env)
    found = probe.stdout.strip()
    if probe.returncode != 0 or not found.startswith(str(site)):
        raise StepFailed(f"import launcher does not find the installed wheel ({found or probe.stderr[-500:].strip()});"
                         f" it must come from {site} (launcher-core needs pluggy installed beside it)")
    step(f"installed {wheel.name} into {site}")
    return env


def run_tests(env: dict[str, str], out: Path) -> dict[str, object]:
    """``pytest -m gpu tests/gpu`` against the installed wheel: its outcome counts."""
    probe = subprocess.run([sys.executable, "-c", "import pytest"], env=env, capture_output=True, timeout=60)
    if probe.returncode != 0:
        raise StepFailed(f"pytest is not installed for {sys.executable}: the lane runs its tests with it")
    env = {**env, "LAUNCHER_LANE_FIGURES": str(out / "figures.jsonl"), "LAUNCHER_LANE_OUT": str(out)}
    (out / "figures.jsonl").unlink(missing_ok=True)
    log = out / "pytest.log"
    result = run("pytest", [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider",
                            "-rs", "-s"], cwd=ROOT, env=env, log=log)
    text = log.read_text()
    tail = [line for line in text.splitlines() if line.strip()][-30:]
    print("\n".join(tail), flush=True)
    counts = {word: int(number) for number, word in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", text)}
    return {"exit": result.returncode, **counts}


def run_figures(env: dict[str, str], out: Path, gpu: bool, runs: int) -> int:
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_figures.py"), "--runs", str(runs),
               "--reuse", str(out / "figures.jsonl"), "--json", str(out / "figures.json")]
    if not gpu:  # the CPU try-out: the figure script's own paths, through the installed wheel
        command += ["--device", "cpu", "--backend", "gloo", "--only", "start,in-place"]
    result = run("figures", command, cwd=ROOT, env=env)
    print(result.stdout, end="", flush=True)
    if result.returncode != 0:
        print(result.stderr[-3000:], file=sys.stderr)
    return result.returncode


def gpu_seen(env: dict[str, str]) -> tuple[bool, str]:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, torch.cuda.is_available(), "
                            "torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"],
                           env=env, capture_output=True, text=True, timeout=120)
    words = probe.stdout.split(maxsplit=2)
    if probe.returncode != 0 or len(words) < 3:
        return False, f"no torch here ({probe.stderr.strip()[-200:]})"
    return words[1] == "True", f"torch {words[0]}, {'device ' + words[2] if words[1] == 'True' else 'no CUDA device'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where the results go (default: $OUT, else a new temporary directory)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each figure the tests did not measure")
    options = parser.parse_args()
    out = Path(options.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_lane_"))
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, object] = {"out": str(out)}
    work = Path(tempfile.mkdtemp(prefix="gpu_lane_work_"))
    status = 1
    try:
        step("building the launcher-core wheel (no network)")
        wheel = build_wheel(work)
        env = install(wheel, work)
        gpu, seen = gpu_seen(env)
        summary["torch"] = seen
        step(f"{seen}: running pytest -m gpu tests/gpu")
        tests = run_tests(env, out)
        summary["tests"] = tests
        step(f"tests: {tests}")
        if seen.startswith("no torch"):
            step("figures: skipped (they need torch)")
            figures_exit = 0
        else:
            step("figures" + ("" if gpu else " (no GPU: the figure script's CPU try-out, gloo on CPU tensors)"))
            figures_exit = run_figures(env, out, gpu, options.runs)
        summary["figures_exit"] = figures_exit
        status = 0 if tests["exit"] == 0 and figures_exit == 0 else 1
    except StepFailed as exc:
        summary["failed"] = str(exc)
        print(f"gpu_lane: {exc}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        summary["seconds"] = round(time.monotonic() - _STARTED, 1)
        summary["ok"] = status == 0
        (out / "lane.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    step(f"{'ok' if status == 0 else 'FAILED'} in {summary['seconds']} s; results in {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
