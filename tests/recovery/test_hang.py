"""A hang (--hang-timeout) is recovered in place too: the hung rank is made to leave its function."""

from __future__ import annotations

from tests.conftest import run_launcher

#: Attempt 0: local rank 1 stops beating at step 3 and spins in Python. Attempt 1: local rank 0
#: does (it can only be seen as hung if its beats reach the new attempt's heartbeat file).
#: Attempt 2: a few steps, then done. The other ranks beat every step meanwhile.
SCRIPT = """
import os, time
import launcher

@launcher.recoverable
def train():
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["LOCAL_RANK"])
    print(f"rank {rank} pid {os.getpid()} attempt {attempt}", flush=True)
    for step in range(5 if attempt == 2 else 400):
        if step == 3 and (attempt, rank) in ((0, 1), (1, 0)):
            while True:
                time.sleep(0.05)
        launcher.heartbeat()
        time.sleep(0.05)
    print(f"rank {rank} done", flush=True)

train()
"""


def test_a_hung_rank_is_recovered_in_place(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--hang-timeout", "2",
                           write_script("hang.py", SCRIPT)], timeout=120)
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        starts = [line.split() for line in result.stdout.splitlines() if f"rank {rank} pid" in line]
        assert [int(words[-1]) for words in starts] == [0, 1, 2], result.stdout
        assert len({words[words.index("pid") + 1] for words in starts}) == 1, result.stdout  # one process
        assert f"rank {rank} done" in result.stdout
    hung = [line for line in result.stderr.splitlines() if "worker group hung:" in line]
    assert len(hung) == 2 and all("recovering in place" in line for line in hung), result.stderr
    assert "recovering in place (restart 1 of 2)" in result.stderr  # the hang report's outcome line
    assert "restarting (" not in result.stderr


#: Attempt 0: local rank 1 stops itself (SIGSTOP: a frozen process, state T) at step 3; it can
#: neither beat nor leave its function. Attempt 1: a few steps, then done.
STOPPED_SCRIPT = """
import os, signal, time
import launcher

@launcher.recoverable
def train():
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["LOCAL_RANK"])
    print(f"rank {rank} pid {os.getpid()} attempt {attempt}", flush=True)
    for step in range(5 if attempt == 1 else 400):
        if step == 3 and (attempt, rank) == (0, 1):
            os.kill(os.getpid(), signal.SIGSTOP)
        launcher.heartbeat()
        time.sleep(0.05)
    print(f"rank {rank} done", flush=True)

train()
"""


def test_a_stopped_hung_rank_is_replaced_in_place_not_waited_for(write_script):
    # --recovery-timeout is far above what the test waits: a stopped rank that had to leave its
    # function would fall back to a full restart after it, and the test would time out first.
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "2",
                           "--recovery-timeout", "600", write_script("stopped.py", STOPPED_SCRIPT)], timeout=90)
    assert result.returncode == 0, result.stderr
    assert "is hung and stopped (state T): killing it now" in result.stderr, result.stderr
    assert "restarting (" not in result.stderr and "did not leave its function" not in result.stderr
    pids = {rank: [line.split()[-3] for line in result.stdout.splitlines() if f"rank {rank} pid" in line]
            for rank in (0, 1)}
    assert len(pids[0]) == 2 and pids[0][0] == pids[0][1], result.stdout  # kept its process
    assert len(pids[1]) == 2 and pids[1][0] != pids[1][1], result.stdout  # a fresh process in its slot
    assert "rank 0 done" in result.stdout and "rank 1 done" in result.stdout
