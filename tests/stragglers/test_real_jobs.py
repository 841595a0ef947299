"""Real jobs on one node: a rank slowed by its data loader mid-job is named, then cleared; off means nothing new."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import run_launcher

pytest.importorskip("torch")

DDP_JOB = str(Path(__file__).resolve().parent / "scripts" / "ddp_job.py")
NAMED = re.compile(r"^launcher: straggler: rank (\d+) \(node \S+, local rank (\d+)\) is ([\d.]+)x slower", re.M)
CLEARED = re.compile(r"^launcher: straggler cleared: rank (\d+) ", re.M)


@pytest.mark.timeout(150)
def test_a_data_loader_slow_mid_job_is_named_then_cleared(tmp_path):
    # Rank 1's loader thread takes 1.5x the compute time from 2 s to 11 s after the first step: its
    # main thread waits on the queue while ranks 0 and 2 wait in DDP's all-reduce for it.
    job = [DDP_JOB, "--seconds", "20", "--compute", "0.05", "--slow-rank", "1", "--slow-loader",
           "--factor", "1.5", "--slow-from", "2", "--slow-until", "11", "--heartbeat"]
    # --straggler-action exclude on one node only reports: no other node to go on with, said once.
    result = run_launcher(["--standalone", "--nproc-per-node", "3", "--straggler-detection",
                           "--straggler-interval", "1", "--straggler-action", "exclude", *job],
                          env={"TMPDIR": str(tmp_path)}, timeout=140)
    detail = result.stderr[-4000:]
    assert result.returncode == 0, detail
    named = NAMED.findall(result.stderr)
    assert [(r, lr) for r, lr, _ in named] == [("1", "1")], detail  # once: repeated only on change
    assert float(named[0][2]) >= 1.15, detail
    assert "steps/s" in result.stderr, detail  # launcher.heartbeat(step): the step rate is in the evidence
    assert CLEARED.findall(result.stderr) == ["1"], detail
    assert re.findall(r"^launcher: straggler not excluded: node \S+ \(rank 1, [\d.]+x slower than the median rank\) "
                      r"stays in the job: the job has no other node to go on with$", result.stderr, re.M), detail
    assert result.stderr.count("not excluded") == 1, detail
    lines = result.stderr.splitlines()
    named_at = next(i for i, line in enumerate(lines) if NAMED.match(line))
    cleared_at = next(i for i, line in enumerate(lines) if CLEARED.match(line))
    assert named_at < cleared_at, detail


def test_off_by_default_the_workers_see_nothing_new(tmp_path):
    # No torch here: the worker prints what launcher put in its environment.
    script = tmp_path / "env.py"
    script.write_text("import os\n"
                      "print(sorted(k for k in os.environ if 'STRAGGLER' in k), os.environ.get('PYTHONPATH'))\n")
    off = run_launcher(["--standalone", "--nproc-per-node", "1", str(script)], timeout=60)
    assert off.returncode == 0 and "[] None" in off.stdout, off.stdout + off.stderr
    on = run_launcher(["--standalone", "--nproc-per-node", "1", "--straggler-detection", str(script)], timeout=60)
    # The start-up hook recorded the worker's pid and took itself off the worker's path.
    assert on.returncode == 0 and "'LAUNCHER_STRAGGLER_PID'" in on.stdout and on.stdout.rstrip().endswith("None"), (
        on.stdout + on.stderr)


WORKER_SIDE = """
import os, struct, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import launcher

def slot():
    with open(os.environ["LAUNCHER_STRAGGLER_FILE"], "rb") as handle:
        handle.seek(64 * int(os.environ["LAUNCHER_STRAGGLER_SLOT"]))
        wait, entered, collectives, step, steps, _ = struct.unpack("<ddqqqd", handle.read(48))
    return collectives, step, steps, wait >= 0.0 and entered == 0.0

dist.init_process_group("gloo")
tensor = torch.ones(4)
dist.all_reduce(tensor)
dist.barrier()
dist.broadcast(tensor, 0)
dist.all_reduce(tensor, async_op=True).wait()  # enqueued only: its wait is at wait(), not timed
print("blocking", slot())
model = DistributedDataParallel(torch.nn.Linear(4, 1))
for step in range(3):
    model.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    launcher.heartbeat(step)
print("ddp", slot(), [hook.__name__ for hook, _ in model._comm_hooks])
print("grad", model.module.weight.grad.tolist() == [[2.0] * 4])  # the mean over one rank: unchanged
"""


def test_the_worker_times_blocking_collectives_ddp_and_steps(tmp_path):
    # One rank, a real gloo group: what the worker writes into its slot, read back from the file.
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SIDE)
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--straggler-detection", str(script)],
                          env={"TMPDIR": str(tmp_path)}, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "blocking (3, 0, 0, True)" in result.stdout, result.stdout + result.stderr[-2000:]
    # Three backward passes through launcher's DDP hook, registered at the first forward; three steps.
    assert "ddp (6, 2, 3, True) ['_mean_allreduce_hook']" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "grad True" in result.stdout, result.stdout
