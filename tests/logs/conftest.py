"""Helpers for the logs tests: run the real ``launcher`` command and look at what it left."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tests.conftest import launcher_env

LAUNCHER = [sys.executable, "-m", "launcher"]


def launch(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``launcher ARGS``; stdout and stderr captured as bytes (workers may write any)."""
    extra = {"OMP_NUM_THREADS": "1"}  # keeps the agent's OMP warning out of stderr
    extra.update(env or {})
    return subprocess.run(
        [*LAUNCHER, *args],
        env=launcher_env(extra),
        capture_output=True,
        timeout=timeout,
        cwd=cwd,
    )


def lines(data: bytes) -> list[str]:
    """Console lines, decoded leniently, without the agent's own ``[launcher]`` messages."""
    return [line for line in data.decode("utf-8", "replace").splitlines() if not line.startswith("[launcher]")]


def run_dir(log_dir: Path) -> Path:
    """The single ``<run_id>_<unique>`` directory under ``log_dir``."""
    found = [p for p in log_dir.iterdir() if p.is_dir()]
    assert len(found) == 1, found
    return found[0]


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


PREFIXED = re.compile(r"^\[default(\d+)\]:(.*)$")


@pytest.fixture
def tmpdir_env(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A private TMPDIR for one launch, to see what it leaves behind."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    return tmp, {"TMPDIR": str(tmp)}
