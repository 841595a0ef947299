"""A sick node on its own: one line naming the check and the reason, exit 69, no worker started."""

from __future__ import annotations

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
