"""Only the worker itself beats for its rank: a child that beats cannot hide a stuck rank."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_launcher

# The worker starts a child that calls launcher.heartbeat() every 50 ms, beats once itself and
# gets stuck. The child beats until its parent is gone, or for 30 s at most; if it beat that long
# (the hang went unnoticed while it did), it leaves a mark.
WORKER = """
import multiprocessing, os, sys, time
import launcher

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

def child_beats(out, parent):  # parent: the worker (a forkserver child's parent is the server)
    end = time.monotonic() + 30
    while time.monotonic() < end and alive(parent):
        launcher.heartbeat()
        time.sleep(0.05)
    if alive(parent):
        open(os.path.join(out, "child_outlived_the_timeout"), "w").close()

def stuck_while_a_child_beats():
    while True:
        time.sleep(0.5)

if __name__ == "__main__":
    out, how = sys.argv[1], sys.argv[2]
    if how == "fork-before-first-beat":  # as DataLoader workers usually are
        if os.fork() == 0:
            try:
                child_beats(out, os.getppid())
            finally:
                os._exit(0)
        launcher.heartbeat()
    else:
        launcher.heartbeat()
        multiprocessing.get_context(how).Process(target=child_beats, args=(out, os.getpid()), daemon=True).start()
    time.sleep(0.5)  # the child is beating
    stuck_while_a_child_beats()
"""


@pytest.mark.parametrize("how", ["fork-before-first-beat", "spawn", "forkserver"])
def test_a_child_that_beats_does_not_keep_a_stuck_worker_alive(how, write_script, tmp_path):
    script = write_script("parent.py", WORKER)
    out = tmp_path / "out"
    out.mkdir()
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--hang-timeout", "2", script, str(out), how],
                          timeout=90)
    assert result.returncode == 1, result.stderr
    assert not (out / "child_outlived_the_timeout").exists(), result.stderr
    assert re.search(r"^  rank 0 on \S+ \(local rank 0, pid \d+\): no heartbeat for", result.stderr, re.M), \
        result.stderr
    assert re.search(r"^  rank 0: stuck_while_a_child_beats \(parent\.py:\d+\)", result.stderr, re.M), result.stderr
