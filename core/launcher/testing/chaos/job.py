"""The chaos campaign's resumable training job: every step checked, checkpointed and logged.

``python job.py STATE_DIR STEPS STEP_SECONDS [recoverable]`` (run by the agents, never imported by
the harness: it imports torch). Every step all-reduces ``[rank + 1, step]`` over gloo and each
rank verifies both sums (every rank took part, every rank is at the same step), then calls
``launcher.heartbeat(step)`` where launcher is importable, prints one line and appends the same
line to its own progress file ``STATE_DIR/progress/<host>-<pid>.log`` (what invariant 6 compares
with the agent's output). Rank 0 rewrites ``STATE_DIR/ckpt.json`` (the step and the "model") after
every step, atomically: the shared STATE_DIR plays shared storage, so a re-formed group of any
size resumes where the last one stopped. The model is a value updated by a rule that depends on
the step alone, so the final digest (``STATE_DIR/result.json``) of an interrupted run equals that
of an uninterrupted one (:func:`expected_digest` in ``launcher.testing.chaos.plan``).

With ``recoverable`` the loop runs under ``@launcher.recoverable`` (recovery in place).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

try:  # the same job runs under torchrun, where launcher may be missing
    import launcher
except ImportError:  # pragma: no cover - torchrun side
    launcher = None  # type: ignore[assignment]


def model_after(step: int, value: float) -> float:
    """The model's value after ``step``: a rule of the step alone (the same in any world size)."""
    return round(value * 0.5 + step + 1, 6)


def digest(steps: int, value: float) -> str:
    return hashlib.sha256(f"{steps}:{value:.6f}".encode()).hexdigest()[:16]


def read_checkpoint(path: str) -> tuple[int, float]:
    try:
        with open(path) as handle:
            saved = json.load(handle)
        return int(saved["step"]), float(saved["value"])
    except FileNotFoundError:
        return -1, 0.0


def write_json_atomic(path: str, value: object) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as handle:
        json.dump(value, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def train(state_dir: str, steps: int, step_seconds: float) -> int:
    ckpt = os.path.join(state_dir, "ckpt.json")
    timeout = datetime.timedelta(seconds=float(os.environ.get("CHAOS_PG_TIMEOUT", "30")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    host = os.environ.get("CHAOS_HOST", socket.gethostname())
    progress = os.path.join(state_dir, "progress", f"{host}-{os.getpid()}.log")
    last, value = read_checkpoint(ckpt)
    start = torch.tensor([last + 1, value], dtype=torch.float64)
    dist.broadcast(start, 0)  # rank 0's checkpoint is the one every rank resumes from
    first, value = int(start[0].item()), float(start[1].item())
    for step in range(first, steps):
        sums = torch.tensor([float(rank + 1), float(step)])
        dist.all_reduce(sums)
        expected = (world * (world + 1) / 2, float(step * world))
        if (sums[0].item(), sums[1].item()) != expected:
            print(f"chaos: rank {rank} step {step}: all_reduce gave {sums.tolist()}, expected {expected}", flush=True)
            return 3
        value = model_after(step, value)
        if launcher is not None:  # a no-op outside launcher
            launcher.heartbeat(step)
        local = os.environ.get("LOCAL_RANK", "0")
        line = (f"chaos step {step} rank {rank} of {world} host {host} local {local} pid {os.getpid()} "
                f"t {time.time():.3f}")
        with open(progress, "a") as handle:
            handle.write(line + "\n")
        print(line, flush=True)
        if rank == 0:
            write_json_atomic(ckpt, {"step": step, "value": value, "world": world})
        time.sleep(step_seconds)
    dist.barrier()
    if rank == 0:
        write_json_atomic(os.path.join(state_dir, "result.json"),
                          {"steps": steps, "value": value, "digest": digest(steps, value)})
    print(f"chaos: rank {rank} of {world} finished {steps} steps", flush=True)
    dist.destroy_process_group()
    return 0


def main() -> int:
    state_dir, steps, step_seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    os.makedirs(os.path.join(state_dir, "progress"), exist_ok=True)
    if len(sys.argv) > 4 and sys.argv[4] == "recoverable" and launcher is not None:
        return int(launcher.recoverable(train)(state_dir, steps, step_seconds))
    return train(state_dir, steps, step_seconds)


if __name__ == "__main__":
    sys.exit(main())
