"""Progress without code over NCCL (issue 46, part 1): a collective on CUDA tensors is progress once
its end event on the GPU's timeline is seen complete, read with ``query()``: launcher never
synchronizes anything for it.

One GPU: one NCCL rank whose only progress is its all_reduces (no optimizer, no launcher call).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import run_launcher

pytestmark = pytest.mark.gpu

# Arguments: "block" (stop in the data loading after some steps) or "run", and where to write how
# many times anything synchronized (the job itself never does: any count is launcher's).
JOB = """
import json, sys, time
import torch
import torch.distributed as dist

mode, out = sys.argv[1], sys.argv[2]
syncs = []
def counting(name, function):
    def wrapper(*args, **kwargs):
        syncs.append(name)
        return function(*args, **kwargs)
    return wrapper
torch.cuda.synchronize = counting("torch.cuda.synchronize", torch.cuda.synchronize)
torch.cuda.Event.synchronize = counting("Event.synchronize", torch.cuda.Event.synchronize)
torch.cuda.Event.wait = counting("Event.wait", torch.cuda.Event.wait)
torch.cuda.Stream.synchronize = counting("Stream.synchronize", torch.cuda.Stream.synchronize)

torch.cuda.set_device(0)
dist.init_process_group("nccl")
value = torch.ones(1 << 20, device="cuda")
for step in range(200):
    if mode == "block" and step == 50:
        with open(out, "w") as handle:
            json.dump(syncs, handle)
        while True:  # a data loader reading from a dead mount
            time.sleep(1)
    dist.all_reduce(value)
    value.fill_(1.0)
    time.sleep(0.02)
with open(out, "w") as handle:
    json.dump(syncs, handle)
dist.destroy_process_group()
"""


@pytest.mark.timeout(150)
def test_nccl_collectives_are_progress_and_a_blocked_rank_is_named(write_script, tmp_path):
    out = tmp_path / "syncs.json"
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--hang-timeout", "5",
                           write_script("nccl_job.py", JOB), "block", str(out)], timeout=140)
    # Watched from its first completed all_reduce (it never calls launcher), so it is judged hung.
    assert result.returncode != 0, result.stderr[-3000:]
    assert re.search(r"^launcher: hang detected by \S+: rank 0 \(local rank 0\): no heartbeat for", result.stderr,
                     re.M), result.stderr[-3000:]
    assert json.loads(out.read_text()) == [], "something synchronized the GPU"


@pytest.mark.timeout(150)
def test_an_nccl_job_that_keeps_going_is_no_hang_and_nothing_synchronizes(write_script, tmp_path):
    out = tmp_path / "syncs.json"
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--hang-timeout", "5",
                           write_script("nccl_job.py", JOB), "run", str(out)], timeout=140)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hang detected" not in result.stderr, result.stderr[-3000:]
    assert json.loads(out.read_text()) == [], "something synchronized the GPU"
