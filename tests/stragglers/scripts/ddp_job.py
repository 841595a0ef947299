"""A small gloo DDP job whose ranks can be made slow: the stragglers tests' and benchmark's workload.

Every step: wait for a batch (a loader thread puts one on a queue after ``--load`` seconds),
"compute" ``--compute`` seconds (a sleep, standing for the GPU's kernels, plus a real
forward and backward of a small model), then DDP's gradient all-reduce. Options make one rank
slower: its compute (``--slow-rank R --factor 1.3``), or its loader (``--slow-loader``), for the
whole run or from ``--slow-from`` to ``--slow-until`` seconds after the first step (``--slow-rank`` is a
global rank: a job re-formed smaller may have none). ``--noise``
adds that much uniform random noise to every rank's compute, every step.
"""

import argparse
import queue
import random
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=10.0)
parser.add_argument("--seconds-at-world", default="",
                    help="W=S,...: run S seconds when the world has W ranks (a job that re-forms smaller)")
parser.add_argument("--steps", type=int, default=0, help="stop after this many steps instead")
parser.add_argument("--compute", type=float, default=0.02)
parser.add_argument("--load", type=float, default=0.0)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--factor", type=float, default=1.3)
parser.add_argument("--slow-loader", action="store_true")
parser.add_argument("--slow-from", type=float, default=0.0)
parser.add_argument("--slow-until", type=float, default=float("inf"))
parser.add_argument("--noise", type=float, default=0.0)
parser.add_argument("--heartbeat", action="store_true", help="call launcher.heartbeat(step)")
parser.add_argument("--report", default="", help="write 'steps seconds' here (rank 0)")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
for item in filter(None, args.seconds_at_world.split(",")):
    world, seconds = item.split("=")
    if int(world) == dist.get_world_size():
        args.seconds = float(seconds)
torch.manual_seed(0)
torch.set_num_threads(1)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
noise = random.Random(1000 + rank)
started = [0.0]


def slow_now():
    elapsed = time.monotonic() - started[0]
    return rank == args.slow_rank and args.slow_from <= elapsed < args.slow_until


def loader(batches):
    while True:
        delay = args.load
        if args.slow_loader and slow_now():
            delay = max(delay, args.compute) * args.factor
        time.sleep(delay)
        batches.put((torch.randn(16, 32), torch.randn(16, 1)))


batches = queue.Queue(maxsize=2)
dist.barrier()
started[0] = time.monotonic()
threading.Thread(target=loader, args=(batches,), daemon=True).start()
step = 0
# By time, a rank leaves only where all agree (below): its own clock alone would let it leave while
# the others enter the next step's all-reduce (connection closed by peer).
while step < args.steps or not args.steps:
    x, y = batches.get()  # the main thread waits for its data loader
    compute = args.compute * (1.0 + noise.uniform(-args.noise, args.noise))
    if slow_now() and not args.slow_loader:
        compute *= args.factor
    time.sleep(compute)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if args.heartbeat:
        import launcher

        launcher.heartbeat(step)
    # Every rank stops at the same step: agree on it once a second (a tiny all-reduce).
    if not args.steps and step % 20 == 0:
        done = torch.tensor([1.0 if time.monotonic() - started[0] >= args.seconds else 0.0])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item():
            break
if rank == 0 and args.report:
    with open(args.report, "w") as handle:
        handle.write(f"{step} {time.monotonic() - started[0]:.6f}\n")
dist.destroy_process_group()
