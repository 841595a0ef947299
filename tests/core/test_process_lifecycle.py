"""No process outlives the agent: signals are forwarded, and SIGKILL of the agent kills the tree."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import LAUNCHER, launcher_env

TREE = """
import os, subprocess, sys, time
out = sys.argv[1]
# A child in the worker's own process group, and a grandchild that escapes it with setsid.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
daemon = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"])
with open(os.path.join(out, os.environ["LOCAL_RANK"]), "w") as f:
    f.write(" ".join(map(str, [os.getpid(), child.pid, daemon.pid])))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for_files(directory: Path, count: int, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = os.listdir(directory)
        if len(names) == count and all((directory / n).read_text().count(" ") == 2 for n in names):
            return [int(pid) for n in names for pid in (directory / n).read_text().split()]
        time.sleep(0.05)
    raise AssertionError(f"workers did not start: {os.listdir(directory)}")


def _wait_dead(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


@pytest.fixture
def tree(write_script, tmp_path):
    out = tmp_path / "pids"
    out.mkdir()
    return write_script("tree.py", TREE), out


def _start(script: str, out: Path, *flags: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*LAUNCHER, "--standalone", "--nproc-per-node", "2", *flags, script, str(out)],
                            env=launcher_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_sigkill_of_agent_kills_every_worker_and_descendant(tree):
    script, out = tree
    agent = _start(script, out)
    try:
        pids = _wait_for_files(out, 2)
        assert all(_alive(pid) for pid in pids)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        survivors = _wait_dead(pids, 5)
        assert not survivors, f"processes outlived the agent: {survivors}"
    finally:
        agent.kill()
        for pid_file in out.iterdir():
            for pid in map(int, pid_file.read_text().split()):
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_is_forwarded_and_tree_cleaned(tree, signum):
    script, out = tree
    agent = _start(script, out)
    pids = _wait_for_files(out, 2)
    agent.send_signal(signum)
    _, stderr = agent.communicate(timeout=60)
    assert agent.returncode == 128 + signum, stderr
    assert signal.Signals(signum).name in stderr.decode()
    assert not _wait_dead(pids, 5)


def test_shutdown_timeout_then_sigkill(write_script, tmp_path):
    ready = tmp_path / "ready"
    script = write_script(
        "stubborn.py",
        f"""
        import signal, time
        signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
        open({str(ready)!r}, "w").close()
        time.sleep(600)
        """,
    )
    agent = subprocess.Popen([*LAUNCHER, "--standalone", "--shutdown-timeout", "1", script],
                             env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    stdout, stderr = agent.communicate(timeout=30)
    elapsed = time.monotonic() - started
    assert agent.returncode == 128 + signal.SIGTERM
    assert b"ignoring SIGTERM" in stdout
    assert b"did not exit within 1s" in stderr
    assert 0.9 < elapsed < 10


def test_custom_signal_forwarded(write_script, tmp_path):
    got = tmp_path / "got"
    ready = tmp_path / "ready"
    script = write_script(
        "usr1.py",
        f"""
        import signal, sys, time
        def handler(signum, frame):
            open({str(got)!r}, "w").write("USR1")
            sys.exit(0)
        signal.signal(signal.SIGUSR1, handler)
        open({str(ready)!r}, "w").close()
        time.sleep(600)
        """,
    )
    agent = subprocess.Popen([*LAUNCHER, "--standalone", "--signals-to-handle", "SIGUSR1,SIGTERM", script],
                             env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    agent.send_signal(signal.SIGUSR1)
    agent.communicate(timeout=30)
    assert got.read_text() == "USR1"
    assert agent.returncode == 128 + signal.SIGUSR1


def test_successful_run_leaves_no_process_behind(write_script, tmp_path):
    pid_file = tmp_path / "bg"
    script = write_script(
        "bg.py",
        f"""
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(p.pid))
        """,
    )
    result = subprocess.run([*LAUNCHER, "--standalone", script], env=launcher_env(), capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not _wait_dead([int(pid_file.read_text())], 5)
