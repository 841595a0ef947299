"""Hang detection for jobs that never call launcher: completed collectives and optimizer steps are
a rank's progress (issue 46, part 1).

Real workers, real gloo collectives, real torch: a plain DDP job with no launcher call in it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.background_job import BackgroundJob
from tests.conftest import launcher_env, run_launcher
from tests.hangs.hook import LOAD_HOOK, TIMING

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (gloo)")


# A plain DDP loop over gloo: no launcher call. Arguments: the rank that blocks in its data loading
# (-1: none), the step at which it blocks, seconds the first step's data take (before any progress),
# the ready-file prefix (each rank writes its pid there after its first step), the go file (the
# loop ends once it exists) and the most steps.
DDP = """
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

block_rank, block_at, slow_first = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
ready, go, steps = sys.argv[4], sys.argv[5], int(sys.argv[6])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def load_batch(step):
    if step == 0:
        time.sleep(slow_first)  # a slow start: nothing counts before the first progress
    if rank == block_rank and step == block_at:
        while True:  # a data loader reading from a dead mount
            time.sleep(1)
    return torch.randn(4, 8)

for step in range(steps):
    if os.path.exists(go):
        break
    loss = model(load_batch(step)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 0:
        with open(f"{ready}.{rank}", "w") as handle:
            handle.write(str(os.getpid()))
    time.sleep(0.02)
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_a_ddp_job_with_no_launcher_call_is_watched_and_the_blocked_rank_named(write_script, tmp_path):
    script = write_script("ddp.py", DDP)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "5", script,
                           "1", "15", "0", str(tmp_path / "ready"), str(tmp_path / "go"), "100000"], timeout=150)
    assert result.returncode == 1, result.stderr
    # No heartbeat() anywhere: the collectives and optimizer steps were the progress, and the rank
    # blocked in its data loading is the one named, in the headline and first among the hung ranks.
    assert re.search(r"^launcher: hang detected by \S+: rank 1 \(local rank 1\): no heartbeat for [\d.]+ s "
                     r"\(timeout 5 s\)", result.stderr, re.M), result.stderr
    assert re.search(r"^Hung ranks:\n  rank 1 on ", result.stderr, re.M), result.stderr
    assert re.search(r"^  rank 1: load_batch \(ddp\.py:\d+\) <- <module> \(ddp\.py:\d+\)$", result.stderr,
                     re.M), result.stderr


# FSDP2 over gloo: its collectives are async (not counted); its optimizer steps are the progress.
FSDP2 = """
import time
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def load_batch(step):
    if dist.get_rank() == 1 and step == 10:
        while True:  # a data loader reading from a dead mount
            time.sleep(1)
    return torch.randn(4, 8)

for step in range(100000):
    model(load_batch(step)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
"""


@pytest.mark.timeout(180)
def test_an_fsdp2_job_with_no_launcher_call_is_watched_too(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "5",
                           write_script("fsdp2.py", FSDP2)], timeout=150)
    assert result.returncode == 1, result.stderr
    assert re.search(r"^launcher: hang detected by \S+: rank 1 \(local rank 1\): no heartbeat for", result.stderr,
                     re.M), result.stderr
    assert re.search(r"^  rank 1: load_batch \(fsdp2\.py:\d+\) <- <module> \(fsdp2\.py:\d+\)$", result.stderr,
                     re.M), result.stderr


@pytest.mark.timeout(180)
def test_the_same_job_unblocked_finishes_with_no_false_alarm(write_script, tmp_path):
    # The first step's data take longer than the timeout: a rank is judged only from its first
    # progress, so a slow start is no hang. Nor is its exit (torch's teardown, after the last
    # step, takes seconds on a busy machine): the end of the job's code is progress too.
    script = write_script("ddp.py", DDP)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "6", script,
                           "-1", "0", "7", str(tmp_path / "ready"), str(tmp_path / "go"), "60"], timeout=150)
    assert result.returncode == 0, result.stderr
    assert "hang detected" not in result.stderr, result.stderr


@pytest.mark.timeout(180)
def test_steps_per_second_come_from_optimizer_steps(write_script, tmp_path):
    from tests.status.jobs import status, wait_for

    ready, go = tmp_path / "ready", tmp_path / "go"
    job = BackgroundJob(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "30",
                         write_script("ddp.py", DDP), "-1", "0", "0", str(ready), str(go), "100000"], go)
    try:
        job.wait_for_ranks([Path(f"{ready}.0"), Path(f"{ready}.1")], "the ranks", timeout=120)

        def stepping():
            result = status(str(job.process.pid), "--json")
            if result.returncode != 0:
                return None
            doc = json.loads(result.stdout)
            ranks = doc["ranks"]
            return doc if all((r["steps_per_s"] or 0) > 0 and (r["step"] or 0) > 0 for r in ranks) else None

        doc = wait_for(stepping, "steps/s from the optimizer steps of both ranks", timeout=90)
        assert all(r["heartbeat_age_s"] is not None for r in doc["ranks"]), doc
    finally:
        code, stderr = job.finish()
    assert code == 0, stderr


# -- the hook itself, in a fresh interpreter -------------------------------------------------------

_HOOK = LOAD_HOOK + """
import json
seen = {"torch_after_install": "torch" in sys.modules, "optim_after_install": "torch.optim" in sys.modules}
if sys.argv[1] == "step":
    import torch
    import torch.optim.optimizer as optimizer
    seen["hooked"] = timing.optimizer_stepped in optimizer._global_optimizer_post_hooks.values()
    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([param], lr=0.1)
    for _ in range(3):
        param.grad = torch.ones(2)
        opt.step()
if sys.argv[1] in ("batches", "thread"):
    import threading, time
    import torch.utils.data
    loader = torch.utils.data.DataLoader(list(range(6)), batch_size=2)
    if sys.argv[1] == "thread":  # a prefetcher of the job's: not the rank's progress
        worker = threading.Thread(target=lambda: seen.__setitem__("batches", len(list(loader))))
        worker.start()
        worker.join()
    else:
        seen["batches"] = len(list(loader))
        seen["before"] = time.monotonic()
        seen["one_more"] = next(iter(loader)).tolist()
seen["finder_installed"] = timing._finder in sys.meta_path
print(json.dumps(seen))
"""


def _run_hook(tmp_path, mode):
    from launcher.hangs.watch import HeartbeatTable

    table = HeartbeatTable(str(tmp_path / "beats"), 2)
    env = launcher_env({"LAUNCHER_HEARTBEAT_FILE": table.path, "LAUNCHER_HEARTBEAT_SLOT": "1",
                        "TIMING": str(TIMING)})
    result = subprocess.run([sys.executable, "-c", _HOOK, mode], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    try:
        return json.loads(result.stdout.splitlines()[-1]), table.read_all()
    finally:
        table.close()


def test_optimizer_steps_beat_and_are_counted(tmp_path):
    seen, slots = _run_hook(tmp_path, "step")
    assert seen["hooked"] and not seen["torch_after_install"], seen
    beat, _, _, _, steps = slots[1]
    assert beat > 0 and steps == 3, slots
    assert slots[0][0] == 0 and slots[0][4] == 0, slots  # another rank's slot is left alone


def test_each_batch_a_data_loader_hands_the_main_thread_beats(tmp_path):
    # An evaluation pass: no optimizer step, maybe no collective per batch (Lightning's validation).
    seen, slots = _run_hook(tmp_path, "batches")
    assert seen["batches"] == 3 and seen["one_more"] == [0, 1], seen  # the batches are the loader's own
    beat, _, _, _, steps = slots[1]
    assert beat >= seen["before"] and steps == 0, (seen, slots)  # the last batch's time; no optimizer step
    seen, slots = _run_hook(tmp_path, "thread")
    assert seen["batches"] == 3 and slots[1][0] == 0, (seen, slots)  # only the main thread's count


def test_the_optimizer_hook_waits_for_the_workers_import(tmp_path):
    # Installing the hook imports nothing; a worker that never imports torch.optim never gets it.
    seen, slots = _run_hook(tmp_path, "nothing")
    assert not seen["torch_after_install"] and not seen["optim_after_install"], seen
    assert seen["finder_installed"], seen  # still waiting for the import
    assert slots[1][0] == 0 and slots[1][4] == 0, slots


def test_the_start_up_hook_imports_no_torch(tmp_path):
    # The real start-up hook under --hang-timeout: the timing module loaded, torch not imported.
    from launcher.hangs.stacks import SITE_DIR
    from launcher.hangs.watch import HeartbeatTable

    table = HeartbeatTable(str(tmp_path / "beats"), 1)
    code = ("import sys, json; print(json.dumps([m for m in ('torch', 'torch.optim', '_launcher_straggler_timing') "
            "if m in sys.modules]))")
    env = launcher_env({"LAUNCHER_HEARTBEAT_FILE": table.path, "LAUNCHER_HEARTBEAT_SLOT": "0",
                        "PYTHONPATH": SITE_DIR})
    try:
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    finally:
        table.close()
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert json.loads(result.stdout) == ["_launcher_straggler_timing"], result.stdout
    assert os.environ.get("LAUNCHER_HEARTBEAT_FILE") is None
