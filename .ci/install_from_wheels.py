"""Build a wheel of every distribution in this repository and run the example job from them alone.

``tox -e wheels`` runs it (CI too). What a user of the package index would get: the core
(``launcher-core``) and every plugin under ``plugins/`` are built as wheels from a copy of the
tree, installed *with their dependencies* into a fresh virtual environment outside the tree (so
each wheel's requirements must resolve: ``launcher-core`` to our wheel, never to the unrelated
``launcher`` of the index), and the README's example job runs there, copied out of the tree and
started from a directory outside it. One line per step; the first failure ends it with status 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Each distribution's name on the index, and where its pyproject.toml lives.
DISTRIBUTIONS = {
    "launcher-core": ".",
    "launcher-etcd": "plugins/launcher-etcd",
    "launcher-webhook": "plugins/launcher-webhook",
    "launcher-jsonlogs": "plugins/launcher-jsonlogs",
    "launcher-torchx": "plugins/launcher-torchx",
    "launcher-nodecheck": "plugins/launcher-nodecheck",
}
#: What the example job needs beyond the wheels (the README's command installs the same).
JOB_REQUIREMENTS = ["torch==2.13.0", "numpy"]
#: Plugin names each plugin wheel must register with launcher, and the distribution that gives them.
PLUGINS = {"etcd": "launcher-etcd", "webhook": "launcher-webhook", "jsonlogs": "launcher-jsonlogs",
           "mounts": "launcher-nodecheck"}
#: Not copied: caches, environments and earlier builds.
SKIP = shutil.ignore_patterns(".git", ".tox", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              ".mypy_cache", ".ruff_cache", ".pytest_cache", "site", "results")


_STARTED = time.monotonic()


def step(what: str) -> None:
    print(f"wheels: [{time.monotonic() - _STARTED:5.1f} s] {what}", flush=True)


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    """Run ``command``; its stdout. A failure ends the check with the command's output."""
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        sys.exit(f"wheels: failed (exit status {result.returncode}): {' '.join(command)}")
    return result.stdout


def outside_tree(path: Path) -> Path:
    path = path.resolve()
    if path == ROOT or ROOT in path.parents:
        sys.exit(f"wheels: {path} is inside the source tree {ROOT}: set TMPDIR to a directory outside it")
    return path


def build(work: Path) -> list[Path]:
    """A wheel of every distribution, built from a copy of the tree (the tree gets no build files)."""
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=SKIP, symlinks=True)
    wheels = work / "wheels"
    step(f"building {len(DISTRIBUTIONS)} wheels")
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
         str(wheels), *(str(source / path) for path in DISTRIBUTIONS.values())], cwd=work)
    built = sorted(wheels.glob("*.whl"))
    names = {wheel.name.split("-")[0].replace("_", "-") for wheel in built}
    if names != set(DISTRIBUTIONS):
        sys.exit(f"wheels: expected wheels of {sorted(DISTRIBUTIONS)}, built {[w.name for w in built]}")
    return built


def environment(work: Path, wheels: list[Path]) -> Path:
    """A fresh virtual environment with the wheels and their dependencies installed; its bin directory."""
    target = work / "venv"
    step(f"creating a virtual environment in {target}")
    # virtualenv (tox's own dependency) rather than venv: it needs no ensurepip, which some
    # system interpreters (Debian's without python3-venv) lack.
    run([sys.executable, "-m", "virtualenv", "--quiet", "--clear", str(target)], cwd=work)
    bin_dir = target / "bin"
    step("installing the wheels, their dependencies and " + ", ".join(JOB_REQUIREMENTS))
    # By name, with the wheels' directory as a source: each requirement (launcher-core>=0.1 of a
    # plugin) must resolve to our wheel, as it will on the index.
    run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--find-links", str(wheels[0].parent), *DISTRIBUTIONS, *JOB_REQUIREMENTS], cwd=work)
    return bin_dir


def job_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a shell that activated the fresh environment: nothing of the tree's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PET_", "TORCHELASTIC_", "LAUNCHER_", "VIRTUAL_ENV", "OMP_"))}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    return env


def check(work: Path, bin_dir: Path) -> None:
    env = job_env(bin_dir)
    job = work / "job"
    job.mkdir()
    shutil.copy2(ROOT / "examples" / "allreduce.py", job / "allreduce.py")
    where = run([str(bin_dir / "python"), "-c", "import launcher; print(launcher.__file__)"], cwd=job, env=env)
    if not where.strip().startswith(str(bin_dir.parent)):
        sys.exit(f"wheels: launcher was imported from {where.strip()}, not from the fresh environment")
    version = run([str(bin_dir / "launcher"), "--version"], cwd=job, env=env).strip()
    step(f"{version}, from {where.strip()}")
    rows = json.loads(run([str(bin_dir / "launcher"), "plugins", "--json"], cwd=job, env=env))
    found = {row["name"]: row["distribution"] for row in rows if row.get("loaded")}
    missing = {name: dist for name, dist in PLUGINS.items() if found.get(name) != dist}
    if missing or found.get("static") != "launcher-core":
        sys.exit(f"wheels: plugins not registered by their wheels: {missing or 'static'}; found {found}")
    for what, name in (("rules", "rules.yml"), ("dashboard", "dashboard.json")):  # package data, not only code
        shipped = run([str(bin_dir / "launcher"), "alerts", what], cwd=job, env=env)
        if shipped != (ROOT / "core" / "launcher" / "status" / "prometheus" / name).read_text():
            sys.exit(f"wheels: `launcher alerts {what}` from the wheel is not the tree's {name}")
    step("launcher alerts rules|dashboard: the wheel ships both files")
    step("running launcher --standalone --nproc-per-node 2 allreduce.py")
    output = run([str(bin_dir / "launcher"), "--standalone", "--nproc-per-node", "2", "allreduce.py"],
                 cwd=job, env=env, timeout=300)
    if "ok: 2 ranks agreed on 1" not in output:
        sys.exit(f"wheels: the example job did not report its result:\n{output}")
    step("ok: the example job ran from the wheels alone")


def main() -> None:
    work = outside_tree(Path(tempfile.mkdtemp(prefix="launcher-wheels-")))
    try:
        wheels = build(work)
        step("built " + ", ".join(wheel.name for wheel in wheels))
        check(work, environment(work, wheels))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
