"""Every rank blocked in C at once, nobody dead: the agent's order to recover must still release them.

Ranks 0 and 1 wait in an all-reduce for rank 2, which waits in a receive from rank 0 that never
comes: a deadlock inside gloo, which no peer's death or abort ends (torch 2.13's gloo abort does
not end a wait in progress, see launcher.recovery.release). ``--hang-timeout`` finds it; every
rank must then leave its function, keep its process and run the next attempt.
"""

from __future__ import annotations

import re

from tests.conftest import run_launcher

HANG_TIMEOUT = 2
#: Generous: from the hang's detection, the release takes about recovery.worker.STUCK_AFTER (1 s).
RELEASE_BOUND_S = 15.0

SCRIPT = """
import os, time
import launcher
import torch
import torch.distributed as dist

@launcher.recoverable
def train():
    dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"rank {rank} pid {os.getpid()} attempt {attempt} at {time.time():.3f}", flush=True)
    value = torch.ones(1)
    for step in range(4):
        launcher.heartbeat()
        if attempt == 0 and step == 2:
            print(f"rank {rank} blocked at {time.time():.3f}", flush=True)
            if rank == 2:
                dist.recv(value, src=0)
            else:
                dist.all_reduce(value)
        dist.all_reduce(value)
        time.sleep(0.05)
    dist.destroy_process_group()
    launcher.heartbeat()
    print(f"rank {rank} done", flush=True)

train()
# Without a heartbeat since the line above, a slow exit (torch's interpreter shutdown takes seconds
# on a loaded 2-core machine: measured 2 to 7 s) would itself look like a hang with a 2 s timeout.
os._exit(0)
"""


def test_every_rank_blocked_in_a_collective_is_released_and_kept(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "3", "--max-restarts", "1", "--hang-timeout",
                           str(HANG_TIMEOUT), write_script("deadlock.py", SCRIPT)], timeout=150)
    out, err = result.stdout, result.stderr
    assert result.returncode == 0, err
    starts = {(int(m[0]), int(m[2])): (int(m[1]), float(m[3]))
              for m in re.findall(r"rank (\d) pid (\d+) attempt (\d) at ([\d.]+)", out)}
    blocked = {int(m[0]): float(m[1]) for m in re.findall(r"rank (\d) blocked at ([\d.]+)", out)}
    assert sorted(blocked) == [0, 1, 2], out
    for rank in range(3):
        assert starts[rank, 0][0] == starts[rank, 1][0], (rank, out)  # the same process, called again
        assert f"rank {rank} done" in out
    # Every rank was in gloo from its "blocked" line until the recovery; each was out and in its
    # next attempt within the hang timeout plus the bound.
    latest = max(blocked.values())
    for rank in range(3):
        waited = starts[rank, 1][1] - latest
        assert 0 < waited < HANG_TIMEOUT + RELEASE_BOUND_S, (rank, waited, err)
    assert "worker group hung:" in err and "recovering in place (0 of 1 restarts left)" in err, err
    assert "in-place recovery not possible" not in err and "restarting (" not in err, err
    # Released by shutting down the connections their process groups had opened (one line each).
    assert len(re.findall(r"shut down \d+ connection\(s\) it opened", err)) >= 1, err
