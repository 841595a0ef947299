"""Shared helpers for launcher's tests: run the real command on real scripts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

LAUNCHER = [sys.executable, "-m", "launcher"]

# A shell without job control starts a background command (`bash .ci/run &`, a CI runner's
# script) with SIGINT ignored, and nohup ignores SIGHUP. Launchers started by the tests would
# inherit that, and launcher deliberately keeps ignoring a signal its parent ignores, so the
# tests of forwarding those signals would fail by where the suite was started from. Give the
# test process (and so every process it starts) the dispositions of an interactive start.
for _signum in (signal.SIGINT, signal.SIGHUP):
    if signal.getsignal(_signum) is signal.SIG_IGN:
        signal.signal(_signum, signal.default_int_handler if _signum == signal.SIGINT else signal.SIG_DFL)


@pytest.hookimpl(optionalhook=True)  # pytest without pytest-xdist runs the tests in one process
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``-n 2 --dist loadgroup`` (the full run without root): two lanes, see :mod:`tests.lanes`; with
    ``--worker-netns`` (the fast lane, the full run's namespaced part), modules spread over workers in
    namespaces of their own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.lanes import PrivateNetworkScheduling, TwoLaneScheduling, private_networks_possible

    if config.getoption("worker_netns") and private_networks_possible():
        return PrivateNetworkScheduling(config, log)
    return TwoLaneScheduling(config, log)


def unwrapped(text: str) -> str:
    """``text`` with every line break (and the indentation around it) made one space.

    The failure report wraps long values at a fixed width, so where a phrase breaks depends on
    the length of the paths, pids and host names before it. Tests that look for a phrase in the
    report's words look in this form, which is the same on every machine.
    """
    return re.sub(r"[ \t]*\n[ \t]*", " ", text)


def launcher_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a launcher run: ours, without the PET_* and torchelastic variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}
    env.pop("OMP_NUM_THREADS", None)
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def run_launcher(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``launcher ARGS`` to completion and capture its output."""
    return subprocess.run(
        [*LAUNCHER, *args],
        env=launcher_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


@pytest.fixture
def write_script(tmp_path: Path) -> Callable[[str, str], str]:
    """``write_script(name, source)`` writes a dedented script into tmp_path; returns its path."""

    def _write(name: str, source: str) -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return str(path)

    return _write
