"""A sick node on its own: one line naming the check and the reason, exit 69, no worker started."""

from __future__ import annotations

import pytest
from launcher.health.api import EXIT_NODE_SICK

from tests.conftest import run_launcher


def _files(tmp_path):
    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    return script, marker


def test_failing_command_keeps_the_node_out(tmp_path):
    script, marker = _files(tmp_path)
    cmd = tmp_path / "check.sh"
    cmd.write_text("#!/bin/sh\necho 'nvidia-fabricmanager is not running'\nexit 1\n")
    cmd.chmod(0o755)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--health-check-cmd", str(cmd), str(script)],
                          env={"OMP_NUM_THREADS": "1"}, timeout=60)
    assert result.returncode == EXIT_NODE_SICK == 69, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "health check 'command' failed: nvidia-fabricmanager is not running" in lines[0]
    assert f"exit status {EXIT_NODE_SICK}" in lines[0]
    assert not marker.exists()


def test_broken_entrypoint_package(tmp_path):
    script, marker = _files(tmp_path)
    result = run_launcher(["--standalone", "-m", "no_such_pkg_for_health.train"], timeout=60, cwd=tmp_path)
    assert result.returncode == EXIT_NODE_SICK, result.stderr
    assert "health check 'python' failed" in result.stderr
    assert "No module named 'no_such_pkg_for_health'" in result.stderr


def test_healthy_node_runs_and_none_turns_checks_off(tmp_path):
    script, marker = _files(tmp_path)
    cmd = tmp_path / "check.sh"
    cmd.write_text("#!/bin/sh\nexit 1\n")
    cmd.chmod(0o755)
    result = run_launcher(["--standalone", "--health-checks", "disk,python", str(script)], timeout=60)
    assert result.returncode == 0, result.stderr
    assert marker.exists()
    marker.unlink()
    result = run_launcher(["--standalone", "--health-checks", "none", str(script)], timeout=60)
    assert result.returncode == 0, result.stderr
    assert marker.exists()


@pytest.mark.parametrize("containment", ["auto", "off"])
def test_agent_killed_mid_check_leaves_no_check_process(tmp_path, containment):
    """The watchdog kills a check's process with the job: in the job's cgroup, and (containment
    off) by the job's token, which every process a check starts carries."""
    import os
    import signal
    import subprocess
    import time

    from tests.conftest import LAUNCHER, launcher_env

    script, marker = _files(tmp_path)
    pid_file = tmp_path / "check.pid"
    cmd = tmp_path / "slow-check.sh"
    cmd.write_text(f"#!/bin/sh\necho $$ > {pid_file}.tmp\nmv {pid_file}.tmp {pid_file}\nexec sleep 300\n")
    cmd.chmod(0o755)
    agent = subprocess.Popen([*LAUNCHER, "--standalone", "--health-check-cmd", str(cmd), str(script)],
                             env=launcher_env({"LAUNCHER_CONTAINMENT": containment}), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline and agent.poll() is None:
            time.sleep(0.05)
        assert pid_file.exists(), agent.stderr.read().decode() if agent.poll() is not None else "no check started"
        check_pid = int(pid_file.read_text())
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(check_pid):
            time.sleep(0.05)
        assert not _alive(check_pid), "the check's process outlived its killed agent"
        assert not marker.exists()
    finally:
        if agent.poll() is None:
            agent.kill()
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_checks_run_again_before_a_restart(tmp_path):
    """Healthy at the first round; the worker fails; sick before the restart's round: exit 69."""
    count = tmp_path / "count"
    cmd = tmp_path / "check.sh"
    cmd.write_text(f"#!/bin/sh\necho x >> {count}\n[ $(wc -l < {count}) -ge 2 ] && echo 'ECC page retired' && exit 1\n"
                   "exit 0\n")
    cmd.chmod(0o755)
    script = tmp_path / "fail.py"
    script.write_text("import sys; sys.exit(3)\n")
    result = run_launcher(["--standalone", "--max-restarts", "2", "--health-check-cmd", str(cmd), str(script)],
                          timeout=60)
    assert result.returncode == EXIT_NODE_SICK, result.stderr
    assert count.read_text().count("x") == 2
    assert "restarting (1 of 2 restarts left)" in result.stderr
    assert "health check 'command' failed: ECC page retired" in result.stderr
