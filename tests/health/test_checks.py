"""The built-in ``disk``, ``python`` and ``command`` checks: healthy, sick and skipped."""

from __future__ import annotations

import os
import sys
import time

import pytest
from launcher.errors import UsageError
from launcher.health.api import HEALTHY, SICK, SKIPPED, CheckContext
from launcher.health.builtin import MIN_FREE_ENV, check_command, check_disk, check_python, min_free_bytes


def _executable(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_disk_healthy_and_sick(tmp_path):
    context = CheckContext(node="n", temp_dir=str(tmp_path), log_dir=str(tmp_path / "not-yet" / "logs"))
    assert check_disk(context).status == HEALTHY
    huge = CheckContext(node="n", env={MIN_FREE_ENV: "1000000"}, temp_dir=str(tmp_path), log_dir=str(tmp_path / "l"))
    result = check_disk(huge)
    assert result.status == SICK
    assert "--log-dir" in result.reason and "1000000.0 GiB needed" in result.reason


def test_disk_threshold_is_validated():
    assert min_free_bytes({}) == 1 << 30
    assert min_free_bytes({MIN_FREE_ENV: "2"}) == 2 << 30
    with pytest.raises(UsageError, match=MIN_FREE_ENV):
        min_free_bytes({MIN_FREE_ENV: "lots"})


def test_python_script_and_module(tmp_path):
    # Another interpreter start setting than the agent's: the interpreter is started to prove it.
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    assert check_python(CheckContext(node="n", env=env, python=sys.executable, script="x.py")).status == HEALTHY
    ok = CheckContext(node="n", env=env, python=sys.executable, module="json.tool", preload=("email",))
    assert check_python(ok).status == HEALTHY
    bad = CheckContext(node="n", env=env, python=sys.executable, module="no_such_package_here.train")
    result = check_python(bad)
    assert result.status == SICK
    assert "No module named 'no_such_package_here'" in result.reason
    broken = tmp_path / "brokenpkg"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('half-installed')\n")
    env_broken = {**env, "PYTHONPATH": str(tmp_path)}
    result = check_python(CheckContext(node="n", env=env_broken, python=sys.executable, module="brokenpkg.train"))
    assert result.status == SICK and "RuntimeError: half-installed" in result.reason
    # --preload modules are the preload template's to import (once per node), not the check's.
    preloaded = CheckContext(node="n", env=env_broken, python=sys.executable, script="x.py", preload=("brokenpkg",))
    assert check_python(preloaded).status == HEALTHY


def test_python_skips_what_the_agents_own_start_proved(tmp_path):
    """This interpreter, a script, the same start-up environment: nothing is run, and the
    answer says why; a difference in any of the three runs the check."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # not read while an interpreter starts
    result = check_python(CheckContext(node="n", env=env, python=sys.executable, script="x.py"))
    assert result.status == SKIPPED
    assert "this agent's own" in result.reason and "same environment" in result.reason
    # A copy of the interpreter at another path is another interpreter.
    other = tmp_path / "python3"
    other.symlink_to(sys.executable)
    assert check_python(CheckContext(node="n", env=env, python=str(other), script="x.py")).status == HEALTHY
    # A -m entrypoint still has its package to find.
    assert check_python(CheckContext(node="n", env=env, python=sys.executable, module="json.tool")).status == HEALTHY
    # A PYTHONHOME given to the workers only: their interpreter cannot start.
    broken = {**env, "PYTHONHOME": str(tmp_path / "no-such-home")}
    result = check_python(CheckContext(node="n", env=broken, python=sys.executable, script="x.py"))
    assert result.status == SICK and "failed starting" in result.reason


def test_a_single_module_entrypoint_is_looked_up_not_run(tmp_path):
    # -m train: importing it would run the job in the check; it is only found.
    (tmp_path / "train.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    assert check_python(CheckContext(node="n", env=env, python=sys.executable, module="train")).status == HEALTHY
    assert not (tmp_path / "ran").exists()
    result = check_python(CheckContext(node="n", env=env, python=sys.executable, module="no_such_train"))
    assert result.status == SICK and "No module named 'no_such_train'" in result.reason


def test_python_finds_a_module_entrypoint_from_the_working_directory(tmp_path):
    # A -m entrypoint's package is looked up from the working directory, as the workers do.
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    context = CheckContext(node="n", env=env, python=sys.executable, module="mypkg.train")
    assert check_python(context).status == SICK  # not on the path from the test's directory
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert check_python(context).status == HEALTHY
    finally:
        os.chdir(old)


def test_python_skipped_without_python():
    assert check_python(CheckContext(node="n", python=None)).status == SKIPPED


def test_python_interpreter_missing(tmp_path):
    result = check_python(CheckContext(node="n", python=str(tmp_path / "nopython")))
    assert result.status == SICK and "cannot start" in result.reason


def test_command_healthy_sick_and_skipped(tmp_path):
    assert check_command(CheckContext(node="n")).status == SKIPPED
    ok = _executable(tmp_path, "ok", "exit 0\n")
    assert check_command(CheckContext(node="n", command=ok)).status == HEALTHY
    bad = _executable(tmp_path, "bad", "echo\necho 'ib0 is down' >&2\necho second line\nexit 3\n")
    result = check_command(CheckContext(node="n", command=bad))
    assert result.status == SICK
    assert result.reason == f"ib0 is down ({bad} exited with status 3)"


def test_command_that_prints_nothing(tmp_path):
    silent = _executable(tmp_path, "silent", "exit 7\n")
    result = check_command(CheckContext(node="n", command=silent))
    assert result.status == SICK
    assert result.reason == f"{silent} exited with status 7 and printed nothing"


def test_command_killed_by_a_signal(tmp_path):
    killed = _executable(tmp_path, "killed", "kill -KILL $$\n")
    result = check_command(CheckContext(node="n", command=killed))
    assert result.status == SICK and "killed by SIGKILL" in result.reason


def test_command_that_hangs_is_killed_with_its_children(tmp_path):
    marker = tmp_path / "child.pid"
    hang = _executable(tmp_path, "hang", f"sleep 300 &\necho $! > {marker}\necho checking\nsleep 300\n")
    started = time.monotonic()
    result = check_command(CheckContext(node="n", command=hang, time_limit=1.0))
    assert time.monotonic() - started < 30
    assert result.status == SICK and "did not finish within 1 s" in result.reason
    child = int(marker.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the command's child outlived the time limit"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
