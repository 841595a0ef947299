"""A real gloo job where one rank is late to all_reduce: the others are shown inside torch's collective."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.conftest import run_launcher

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (gloo)")

LATE = """
import datetime, os, time
import torch
import torch.distributed as dist
import launcher

def slow_loader():
    time.sleep(120)

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
value = torch.tensor([1.0])
# The late rank beats last (a few ms after the others), so the oldest heartbeat is not its own.
if dist.get_rank() != 2:
    launcher.heartbeat()
dist.barrier()
if dist.get_rank() == 2:
    launcher.heartbeat()
    slow_loader()
dist.all_reduce(value)
"""


def test_ranks_waiting_in_all_reduce_are_grouped_apart_from_the_late_one(write_script):
    result = run_launcher(
        ["--standalone", "--nproc-per-node", "3", "--hang-timeout", "2", write_script("late.py", LATE)], timeout=120
    )
    assert result.returncode == 1, result.stderr
    # Every rank stopped beating: all are hung, and the groups show who waits for whom.
    assert re.search(r"^  ranks 0-1: all_reduce \(distributed_c10d\.py:\d+\) <- ", result.stderr, re.M), result.stderr
    assert re.search(r"^  rank 2: slow_loader \(late\.py:\d+\) <- <module> \(late\.py:\d+\)$", result.stderr,
                     re.M), result.stderr
    # Their last heartbeats are about as old, yet the late rank is the one named: in the headline,
    # first among the hung ranks, and in the failure report.
    assert re.search(r"^launcher: hang detected by \S+: rank 2 \(local rank 2\): no heartbeat for", result.stderr,
                     re.M), result.stderr
    assert re.search(r"^Hung ranks:\n  rank 2 on ", result.stderr, re.M), result.stderr
    assert re.search(r"^  hang +: detected by \S+: rank 2 \(local rank 2\)", result.stderr, re.M), result.stderr
