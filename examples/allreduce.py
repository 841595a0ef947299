"""A real distributed job: every rank contributes its rank, gloo sums them, rank 0 reports.

Run it with ``launcher --standalone --nproc-per-node 4 examples/allreduce.py`` (or torchrun).
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    expected = world * (world - 1) / 2
    print(f"rank {rank}/{world} (local {os.environ['LOCAL_RANK']}): all_reduce sum = {total.item():.0f}")
    assert total.item() == expected
    dist.barrier()
    if rank == 0:
        print(f"ok: {world} ranks agreed on {expected:.0f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
