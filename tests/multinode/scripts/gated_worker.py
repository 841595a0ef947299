"""A worker that waits for the test's go-ahead: ``gated_worker.py STATE_DIR``.

Once its group has formed, rank 0 writes ``STATE_DIR/ready-<world size>`` (JSON: the workers'
store's ``MASTER_ADDR`` and ``MASTER_PORT``), and every rank waits until ``STATE_DIR/go`` exists,
then all-reduces once, prints ``rank R of W all_reduce ok S`` and exits 0. So a test acts on a
running job (its rounds closed, its workers connected) for as long as it needs, then lets it
finish normally, without depending on how long anything takes.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    state_dir = sys.argv[1]
    timeout = datetime.timedelta(seconds=float(os.environ.get("MN_PG_TIMEOUT", "60")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(torch.ones(1))
    if rank == 0:
        ready = os.path.join(state_dir, f"ready-{world}")
        with open(f"{ready}.tmp", "w") as handle:
            json.dump({"addr": os.environ["MASTER_ADDR"], "port": int(os.environ["MASTER_PORT"])}, handle)
        os.replace(f"{ready}.tmp", ready)
    while not os.path.exists(os.path.join(state_dir, "go")):
        time.sleep(0.05)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    expected = world * (world + 1) // 2
    status = "ok" if value.item() == expected else f"MISMATCH expected {expected}"
    print(f"rank {rank} of {world} all_reduce {status} {value.item():.0f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if status == "ok" else 3


if __name__ == "__main__":
    sys.exit(main())
