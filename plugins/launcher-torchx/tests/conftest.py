"""Fixtures for the launcher-torchx tests: a real install of the plugin, and a job directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torchx_plugin_support import ALLREDUCE_SCRIPT, FAILING_SCRIPT, PLUGIN_ROOT, python_shim


@pytest.fixture(scope="session")
def installed_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin pip-installed into a directory, so TorchX finds it through its entry points.

    Built from a copy: an in-tree build would leave build/ and *.egg-info in the shared checkout.
    """
    pytest.importorskip("torchx", reason="torchx is not installed (pip install torchx)")
    base = tmp_path_factory.mktemp("launcher_torchx_install")
    source = base / "src"
    shutil.copytree(PLUGIN_ROOT, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    target = base / "site"
    subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-deps", "--no-build-isolation", "--no-index", "--target", str(target), str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert list(target.glob("launcher_torchx-*.dist-info"))
    return target


@pytest.fixture(scope="session")
def shim_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose ``python`` is this interpreter, put first on the jobs' PATH."""
    return python_shim(tmp_path_factory.mktemp("launcher_torchx_python"))


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """The directory a local_cwd job runs in, holding the worker scripts (``ar.py``, ``fail.py``)."""
    (tmp_path / "ar.py").write_text(ALLREDUCE_SCRIPT)
    (tmp_path / "fail.py").write_text(FAILING_SCRIPT)
    return tmp_path
