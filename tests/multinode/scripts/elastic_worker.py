"""A resumable training loop for elastic tests: K steps of gloo all_reduce with a checkpoint.

``elastic_worker.py STATE_DIR STEPS STEP_SECONDS``. Rank 0 reads ``STATE_DIR/ckpt.json`` (the
last completed step) and broadcasts where to resume, so a re-formed group, whatever its size,
continues where the previous one stopped. Every step all-reduces ``[rank + 1, step]`` and checks
both sums (every rank took part, every rank is at the same step); rank 0 then appends one JSON
line to ``STATE_DIR/progress.jsonl`` (step, world size, restart count, group world size) and
rewrites the checkpoint atomically. The shared STATE_DIR plays the part of shared storage: every
namespace host sees the same file system.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def read_checkpoint(path: str) -> int:
    try:
        with open(path) as handle:
            return int(json.load(handle)["step"])
    except FileNotFoundError:
        return -1


def write_json_atomic(path: str, value: object) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as handle:
        json.dump(value, handle)
    os.replace(tmp, path)


def main() -> int:
    state_dir, steps, step_seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ckpt = os.path.join(state_dir, "ckpt.json")
    timeout = datetime.timedelta(seconds=float(os.environ.get("MN_PG_TIMEOUT", "60")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    start = torch.tensor([read_checkpoint(ckpt) + 1 if rank == 0 else 0], dtype=torch.int64)
    dist.broadcast(start, 0)
    first = int(start.item())
    print(f"rank {rank} of {world}: starting at step {first}", flush=True)
    for step in range(first, steps):
        value = torch.tensor([float(rank + 1), float(step)])
        dist.all_reduce(value)
        expected = (world * (world + 1) / 2, step * world)
        if (value[0].item(), value[1].item()) != expected:
            print(f"rank {rank} step {step}: all_reduce gave {value.tolist()}, expected {expected}", flush=True)
            return 3
        if rank == 0:
            record = {
                "step": step,
                "world": world,
                "sum": value[0].item(),
                "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
                "nodes": int(os.environ["GROUP_WORLD_SIZE"]),
                "time": time.time(),
            }
            with open(os.path.join(state_dir, "progress.jsonl"), "a") as handle:
                handle.write(json.dumps(record) + "\n")
            write_json_atomic(ckpt, {"step": step})
        time.sleep(step_seconds)
    dist.barrier()
    print(f"rank {rank} of {world}: finished {steps} steps", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
