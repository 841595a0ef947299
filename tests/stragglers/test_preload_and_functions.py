"""Workers no start-up hook starts: ``--preload`` workers (forked from a template that imported
torch) and function workers (``launch(config, fn)``) time their collectives as script workers do."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import launcher_env, run_launcher

pytest.importorskip("torch")

SCRIPTS = Path(__file__).resolve().parent / "scripts"
NAMED = re.compile(r"^launcher: straggler: rank (\d+) \(node \S+, local rank (\d+)\) is ([\d.]+)x slower", re.M)
SEEN = re.compile(r"^launcher: stragglers seen during this job: rank (\d+) ", re.M)


def _assert_only_named(stderr: str, rank: str) -> None:
    detail = stderr[-4000:]
    named = NAMED.findall(stderr)
    assert named, "no straggler named: " + detail
    assert {(r, lr) for r, lr, _ in named} == {(rank, rank)}, detail  # one node: local rank is rank
    assert all(float(ratio) >= 1.15 for _, _, ratio in named), detail
    assert SEEN.findall(stderr) == [rank], detail


@pytest.mark.timeout(120)
def test_a_slow_rank_of_a_preloaded_job_is_named(tmp_path):
    # The template imported torch, torch.distributed and DDP before any rank existed: each forked
    # worker wraps them at once, in itself (the template holds no rank's timing state).
    job = [str(SCRIPTS / "ddp_job.py"), "--seconds", "10", "--compute", "0.05", "--slow-rank", "2",
           "--factor", "1.3"]
    result = run_launcher(["--standalone", "--nproc-per-node", "3", "--preload", "torch", "--straggler-detection",
                           "--straggler-interval", "1", *job], env={"TMPDIR": str(tmp_path)}, timeout=110)
    assert result.returncode == 0, result.stderr[-4000:]
    # Every --preload notice says it did not apply (not preloading, not this entrypoint...): none.
    assert not [line for line in result.stderr.splitlines() if "--preload" in line], result.stderr[-4000:]
    _assert_only_named(result.stderr, "2")


@pytest.mark.timeout(120)
def test_a_slow_rank_of_a_function_job_is_named(tmp_path):
    # launch(config, fn) with straggler_settings(): multiprocessing starts the workers, with no
    # start-up hook, from the caller's process, which imported torch at its top. fork, not the
    # default spawn: the same path in the worker (torch imported before fn, timing installed at
    # once), without spawn's import of torch in every rank (half this test's CPU on 2 cores).
    result = subprocess.run([sys.executable, str(SCRIPTS / "function_job.py"), "10", "1", "fork"],
                            capture_output=True, text=True, timeout=110, cwd=str(tmp_path),
                            env=launcher_env({"TMPDIR": str(tmp_path)}))
    assert result.returncode == 0, result.stderr[-4000:]
    steps = re.search(r"^steps \{0: (\d+), 1: (\d+), 2: (\d+)\}$", result.stdout, re.M)
    assert steps and len(set(steps.groups())) == 1, result.stdout  # every rank ran the same steps
    _assert_only_named(result.stderr, "1")


def test_the_preload_template_gets_no_straggler_variables():
    # One attempt's timing file in the template's environment would re-create the template at every
    # restart, and would let a module imported there see a rank's state: the workers alone get them.
    from launcher.hangs.stacks import SITE_DIR
    from launcher.preload.preload import template_env

    envs = [{"PATH": "/bin", "PYTHONPATH": SITE_DIR, "LAUNCHER_STRAGGLER_FILE": "/tmp/x/timings.1",
             "LAUNCHER_STRAGGLER_HOOK": "/x/timing.py", "LAUNCHER_STRAGGLER_SLOT": str(rank)} for rank in range(2)]
    assert template_env(envs) == {"PATH": "/bin"}
