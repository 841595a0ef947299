"""launcher-nodecheck: its checks against the conformance suite, and installed as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launcher.health.api import EXIT_NODE_SICK, CheckContext
from launcher.testing import HealthCheckConformance

PLUGIN_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PLUGIN_ROOT))  # the source tree, for the conformance tests

import launcher_nodecheck.plugin  # noqa: E402


class TestMounts(HealthCheckConformance):
    health_check_name = "mounts"
    plugin = launcher_nodecheck.plugin
    plugin_module = "launcher_nodecheck.plugin"

    @pytest.fixture
    def healthy_context(self) -> CheckContext:
        return CheckContext(node="n", env={"LAUNCHER_NODECHECK_MOUNTS": "/,/proc"})

    @pytest.fixture
    def sick_context(self, tmp_path: Path) -> CheckContext:
        return CheckContext(node="n", env={"LAUNCHER_NODECHECK_MOUNTS": f"/proc,{tmp_path}"})


class TestShm(HealthCheckConformance):
    health_check_name = "shm"
    plugin = launcher_nodecheck.plugin
    plugin_module = "launcher_nodecheck.plugin"

    @pytest.fixture
    def healthy_context(self, tmp_path: Path) -> CheckContext:
        return CheckContext(node="n", env={"LAUNCHER_NODECHECK_MIN_SHM_GIB": "0.001",
                                           "LAUNCHER_NODECHECK_SHM_PATH": str(tmp_path)})

    @pytest.fixture
    def sick_context(self, tmp_path: Path) -> CheckContext:
        return CheckContext(node="n", env={"LAUNCHER_NODECHECK_MIN_SHM_GIB": "1e9",
                                           "LAUNCHER_NODECHECK_SHM_PATH": str(tmp_path)})


def _install(tmp_path: Path) -> Path:
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the shared checkout.
    source = tmp_path / "src"
    shutil.copytree(PLUGIN_ROOT, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--no-index", "--target", str(target), str(source)],
        check=True, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    return target


@pytest.mark.slow
def test_installed_distribution_is_listed_and_keeps_a_node_out(tmp_path: Path) -> None:
    target = _install(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    listing = subprocess.run([sys.executable, "-m", "launcher", "plugins"], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=120)
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines() if line.startswith("health check")]
    assert {(r[2], r[-3]) for r in rows if r[2] in ("mounts", "shm")} == {
        ("mounts", "launcher-nodecheck"), ("shm", "launcher-nodecheck")}, listing.stdout

    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    missing = tmp_path / "scratch"
    missing.mkdir()
    sick = subprocess.run([sys.executable, "-m", "launcher", "--standalone", str(script)], capture_output=True,
                          text=True, env={**env, "LAUNCHER_NODECHECK_MOUNTS": str(missing)}, cwd=tmp_path,
                          timeout=120)
    assert sick.returncode == EXIT_NODE_SICK, sick.stderr
    assert f"health check 'mounts' failed: required mount {missing} is not mounted" in sick.stderr
    assert not marker.exists()
    # Unset: the check skips itself and the job runs.
    fine = subprocess.run([sys.executable, "-m", "launcher", "--standalone", str(script)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert fine.returncode == 0, fine.stderr
    assert marker.exists()
