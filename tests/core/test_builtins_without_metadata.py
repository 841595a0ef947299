"""The core's own plugins work from a bare source tree, with no installed metadata at all.

Run from a zipapp, a vendored copy or ``PYTHONPATH=core``, there is no ``launcher`` dist-info to
read entry points from; the built-ins must still be there, because the core registers them itself.
The interpreter here runs with ``-S`` (no site-packages, so neither the editable install's
finder nor its dist-info), and sees only the ``launcher`` package (through a link, so no
``launcher.egg-info`` beside it either) and pluggy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pluggy
import pytest
from launcher.plugins.manager import BUILTIN_PLUGINS, builtin_plugin_name

from tests.conftest import launcher_env

ROOT = Path(__file__).resolve().parents[2]

#: Checks that nothing declares launcher's metadata in this process, then runs the command.
BARE = """
import importlib.metadata, sys
from launcher.plugins import entrypoints

declared = sorted({ep.distribution for ep in entrypoints.entry_points("launcher")})
assert "launcher-core" not in declared, f"launcher's entry points are on sys.path: {declared}"
try:
    importlib.metadata.distribution("launcher-core")
except importlib.metadata.PackageNotFoundError:
    pass
else:
    sys.exit("launcher's metadata is on sys.path")
assert sys.modules["launcher"].__file__.startswith(sys.argv[1]), sys.modules["launcher"].__file__

from launcher.cli import main

main(sys.argv[2:])
"""


@pytest.fixture
def bare_path(tmp_path: Path) -> str:
    """A ``PYTHONPATH`` holding only the ``launcher`` package and pluggy."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "launcher").symlink_to(ROOT / "core" / "launcher", target_is_directory=True)
    (source / "pluggy").symlink_to(Path(pluggy.__file__).parent, target_is_directory=True)
    return str(source)


def run_bare(bare_path: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-S", "-c", BARE, os.path.join(bare_path, "launcher"), *args],
        env=launcher_env({"PYTHONPATH": bare_path}),
        cwd=bare_path,  # "-c" puts the working directory first on sys.path: no metadata there either
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_builtin_is_listed_without_metadata(bare_path: str) -> None:
    result = run_bare(bare_path, ["plugins", "--json"])
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    found = {(row["kind"], row["name"]) for row in rows}
    assert found == {
        ("rendezvous backend", "static"),
        ("rendezvous backend", "c10d"),
        ("logs specs", "default"),
        ("event handler", "null"),
        ("event handler", "console"),
        ("event handler", "jsonl"),
        ("numa strategy", "node"),
        ("numa strategy", "socket"),
        ("numa strategy", "exclusive"),
        ("numa strategy", "core-complex"),
        ("device provider", "auto"),
        ("device provider", "cpu"),
        ("device provider", "cuda"),
        ("device provider", "xpu"),
        ("device provider", "privateuse1"),
        ("cluster environment", "openmpi"),
        ("cluster environment", "mpich"),
        ("cluster environment", "pmix"),
        ("cluster environment", "slurm"),
        ("cluster environment", "lsf"),
        ("cluster environment", "kubeflow"),
        ("health check", "gpu"),
        ("health check", "disk"),
        ("health check", "python"),
        ("health check", "command"),
        ("topology source", "file"),
        ("topology source", "slurm"),
        ("topology source", "nvml"),
    }
    assert {row["plugin"] for row in rows} == {builtin_plugin_name(module) for module in BUILTIN_PLUGINS}
    assert "builtin-logs-specs" in {row["plugin"] for row in rows}  # the names LAUNCHER_BLOCK_PLUGINS takes
    assert {(row["distribution"], row["loaded"]) for row in rows} == {("launcher-core", True)}


def test_a_standalone_job_runs_without_metadata(bare_path: str, tmp_path: Path) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    script = tmp_path / "noop.py"
    script.write_text(f"import os\nopen(os.path.join({str(out)!r}, os.environ['RANK']), 'w').close()\n")
    result = run_bare(bare_path, ["--standalone", "--nproc-per-node", "2", str(script)])
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == ["0", "1"]
