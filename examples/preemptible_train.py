"""A training job that survives preemption: it saves on launcher's notice and resumes from it.

Run it under Slurm with ``sbatch examples/preemptible_job.sh`` (docs/preemption.md), or on one
machine::

    launcher --standalone --nproc-per-node 2 --preemption-grace 30 examples/preemptible_train.py --ckpt-dir ckpt

Every step the ranks agree, in one tiny all_reduce, whether any of them has seen
``launcher.preempted()``: the notice reaches every rank within a second, not at the same step,
and a rank that leaves its loop alone would leave the others waiting in the next collective. Once
they agree, every rank writes its part of the checkpoint (rank 0 also the model and optimizer)
and exits 0; launcher then ends the job with exit status 75, and with ``--requeue`` Slurm starts
it again. The restarted job finds the checkpoint and goes on from the step it stopped at, so its
final weights are the same, bit for bit, as an uninterrupted run's (gloo on CPU is
deterministic). ``LAUNCHER_PREEMPTION_COUNT`` says how many times the job was requeued before.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import launcher
import torch
import torch.distributed as dist


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same data for a given step and rank in every run: resuming must not change it."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True) * 0.5


def save(ckpt: Path, step: int, rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Each rank writes its part; rank 0 also the model and optimizer (written whole, then renamed)."""
    ckpt.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        partial = ckpt / "model.pt.partial"
        torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, partial)
        os.replace(partial, ckpt / "model.pt")
    (ckpt / f"rank-{rank}.json").write_text(json.dumps({"step": step}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-time", type=float, default=0.02, help="seconds of pretend work per step")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9)
    start = 0
    saved = args.ckpt_dir / "model.pt"
    if saved.exists():  # a continuation: go on from the checkpoint
        state = torch.load(saved)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        count = os.environ.get("LAUNCHER_PREEMPTION_COUNT", "0")
        print(f"rank {rank}: resuming at step {start} (requeued {count} time(s) before)", flush=True)

    for step in range(start, args.steps):
        # Agree on stopping: any rank that saw the notice stops them all, at the same step.
        stop = torch.tensor([1.0 if launcher.preempted() else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            save(args.ckpt_dir, step, rank, model, optimizer)
            dist.barrier()  # every part is written before any rank leaves
            print(f"rank {rank}: preempted at step {step}, checkpoint saved", flush=True)
            dist.destroy_process_group()
            return
        x, y = batch(step, rank)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for param in model.parameters():  # average the gradients (what DDP does)
            assert param.grad is not None
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()
        if rank == 0 and step % 100 == 0:
            print(f"step {step}", flush=True)
        time.sleep(args.step_time)

    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    if rank == 0:
        print(f"final weights: {' '.join(repr(w) for w in weights.tolist())}", flush=True)  # every digit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
