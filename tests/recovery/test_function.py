"""Recovery in place with the Python API: ``launch(config, fn)`` where ``fn`` is wrapped by
``launcher.recoverable``. The function workers are the processes the agent started (spawned, or
forked from the agent, which imported the wrapper itself), so they recover like a script's.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from launcher import LaunchConfig, launch, recoverable

#: The pid of each call of ``train`` in this process (kept across a recovery: it is outside it).
CALLS: list[int] = []


@recoverable
def train(how: str) -> dict[str, Any]:
    """Local rank 1 fails in the first attempt (``how``: ``raise`` or ``kill``), while rank 0 waits
    in an all-reduce; returns what the test checks."""
    import torch
    import torch.distributed as dist

    CALLS.append(os.getpid())
    dist.init_process_group("gloo")
    rank, restart = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    value = torch.tensor([float(rank + 1)])
    if rank == 1 and restart == 0:
        time.sleep(0.5)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("rank 1 fails once")
    dist.all_reduce(value)
    dist.destroy_process_group()
    return {"calls": list(CALLS), "restart": restart, "sum": value.item()}


@pytest.mark.parametrize(("start_method", "how"), [("spawn", "raise"), ("fork", "kill")])
def test_a_function_recovers_in_place(start_method, how, caplog):
    config = LaunchConfig(nproc_per_node=2, max_restarts=1, start_method=start_method)
    results = launch(config, train)(how)
    err = caplog.text  # the agent's lines (the workers' output goes to the captured descriptors)
    assert all(r["restart"] == 1 and r["sum"] == 3.0 for r in results.values()), (results, err)
    assert "recovering in place (0 of 1 restarts left)" in err and "restarting (" not in err, err
    kept = results[0]["calls"]
    assert len(kept) == 2 and kept[0] == kept[1], results  # rank 0: called twice, in one process
    if how == "raise":
        assert "raised RuntimeError: rank 1 fails once" in err
        assert len(results[1]["calls"]) == 2 and len(set(results[1]["calls"])) == 1, results
    else:
        assert "was killed by SIGKILL; recovering in place" in err
        assert len(results[1]["calls"]) == 1 and results[1]["calls"][0] not in kept, results  # a fresh process
