"""``--hang-timeout auto`` keeps what it learned across a recovery in place (issue 46): the
recovered attempt judges with the learned value from its first steps, not the start timeout."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.conftest import run_launcher

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")

#: No launcher call but @recoverable: progress is the optimizer's steps (the start-up hook counts
#: them), which teach a steady timeout within the first 60 (the floor here). Attempt 0: local
#: rank 1 raises at step 150: recovered in place. Attempt 1 (the same processes): local rank 1
#: stops making progress at its step 3, long before a new learner would have learned anything
#: (its warm-up alone is 10 intervals).
SCRIPT = """
import os, time
import torch
import launcher

@launcher.recoverable
def train():
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["LOCAL_RANK"])
    print(f"rank {rank} pid {os.getpid()} attempt {attempt}", flush=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(100000):
        if (attempt, rank, step) == (0, 1, 150):
            raise RuntimeError("a failure at step 150")
        if (attempt, rank, step) == (1, 1, 3):
            while True:
                time.sleep(0.05)
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        time.sleep(0.05)

train()
"""

#: The start timeout far above the floor: a detection within it used the learned value.
START = 120
FLOOR = 8


@needs_torch
@pytest.mark.timeout(150)
def test_a_recovery_in_place_judges_with_the_timeout_learned_before(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                           "--hang-timeout", "auto", "--hang-start-timeout", str(START),
                           "--hang-floor", str(FLOOR), write_script("learned.py", SCRIPT)], timeout=120)
    assert result.returncode == 1, result.stderr  # the hang in attempt 1: no restart left
    learned = re.findall(r"hang timeout \(steady\) learned: ([\d.]+) s", result.stderr)
    assert learned and float(learned[0]) == FLOOR, result.stderr
    assert "recovering in place" in result.stderr, result.stderr
    for rank in (0, 1):  # recovered in place: each rank kept its process
        pids = {line.split("pid ")[1].split()[0] for line in result.stdout.splitlines() if f"rank {rank} pid" in line}
        assert len(pids) == 1, result.stdout
    found = re.search(r"^launcher: hang detected by \S+: rank 1 \(local rank 1\): no heartbeat for ([\d.]+) s "
                      r"\(learned timeout ([\d.]+) s\)", result.stderr, re.M)
    assert found, result.stderr
    assert float(found.group(2)) == FLOOR and float(found.group(1)) < START, result.stderr
    assert result.stderr.count("hang detected") == 1, result.stderr
