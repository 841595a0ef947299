"""``launch(config, fn)``: a gloo DDP job in function workers, one rank's compute slower.

``python function_job.py SECONDS SLOW_RANK [START_METHOD]``: 3 ranks, each step a sleep of 50 ms
(standing for the GPU's kernels; ``SLOW_RANK``'s 30% longer), a forward and backward of a small
model and DDP's gradient all-reduce, with straggler detection on through the Python API's
settings (interval 1 s). Prints each rank's step count.

torch is imported at the top, as a training script does: ``spawn`` re-imports this file in every
worker (``fork`` inherits it), so ``torch.distributed`` is imported before launcher times it.
"""

import sys
import time

import torch
import torch.distributed as dist
from launcher import LaunchConfig, launch
from launcher.stragglers.settings import straggler_settings
from torch.nn.parallel import DistributedDataParallel

COMPUTE = 0.05


def train(seconds, slow_rank):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                                        torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dist.barrier()
    started = time.monotonic()
    step = 0
    while True:
        time.sleep(COMPUTE * (1.3 if rank == slow_rank else 1.0))
        loss = torch.nn.functional.mse_loss(model(torch.randn(16, 32)), torch.randn(16, 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 20 == 0:  # every rank leaves at the same step: agree on it (a tiny all-reduce)
            done = torch.tensor([1.0 if time.monotonic() - started >= seconds else 0.0])
            dist.all_reduce(done, op=dist.ReduceOp.MAX)
            if done.item():
                break
    dist.destroy_process_group()
    return step


if __name__ == "__main__":
    seconds, slow_rank = float(sys.argv[1]), int(sys.argv[2])
    start_method = sys.argv[3] if len(sys.argv) > 3 else "spawn"
    config = LaunchConfig(nproc_per_node=3, start_method=start_method,
                          settings={"stragglers": straggler_settings(interval=1)})
    print("steps", launch(config, train)(seconds, slow_rank))
