"""One gloo all_reduce across every worker of the job; prints one line the tests check.

Each rank contributes ``rank + 1``; the sum must be ``W * (W + 1) / 2`` on every rank.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    timeout = datetime.timedelta(seconds=float(os.environ.get("MN_PG_TIMEOUT", "60")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    expected = world * (world + 1) // 2
    status = "ok" if value.item() == expected else f"MISMATCH expected {expected}"
    print(
        f"rank {rank} of {world} (group rank {os.environ['GROUP_RANK']}, local rank {os.environ['LOCAL_RANK']}) "
        f"all_reduce {status} {value.item():.0f}",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()
    return 0 if status == "ok" else 3


if __name__ == "__main__":
    sys.exit(main())
