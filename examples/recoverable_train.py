"""A deterministic toy training loop that recovers in place under launcher (docs/recovery.md).

::

    launcher --standalone --nproc-per-node 4 --max-restarts 3 examples/recoverable_train.py

Every rank keeps an in-memory checkpoint of the last two steps *outside* the training function;
after a recovery the ranks agree on the latest step they all can return to, and a rank that has
no checkpoint (a fresh process that replaced a dead one) receives it from a rank that has.

Knobs (environment): ``TOY_STEPS`` (default 10); ``TOY_FAIL`` = ``RANK:STEP:raise`` or
``RANK:STEP:kill`` makes that rank raise (or SIGKILL itself) at that step of the first attempt;
``TOY_OUT``, a directory where each rank appends what happened to ``rank<N>.jsonl``; with it, the
failing rank first waits until every peer has said it entered that step's all-reduce (so each one
is blocked there when the rank fails); ``TOY_FAIL_DELAY`` seconds it waits besides;
``TOY_STEP_SLEEP`` seconds each step sleeps (the benchmark's steady state).
"""

import json
import os
import signal
import sys
import time

import launcher
import torch
import torch.distributed as dist

STEPS = int(os.environ.get("TOY_STEPS", "10"))
#: In-memory checkpoints, by step: kept across a recovery because they live outside train().
checkpoints: dict[int, torch.Tensor] = {}
#: Larger than any step: "no checkpoint here" in the all-reduce that agrees on one.
NONE = 2**31


def record(rank: int, **fields) -> None:
    out = os.environ.get("TOY_OUT")
    if out:
        with open(os.path.join(out, f"rank{rank}.jsonl"), "a") as handle:
            handle.write(json.dumps({"pid": os.getpid(), "t": time.time(), **fields}) + "\n")


def resume_point(rank: int) -> tuple[int, torch.Tensor]:
    """The step to start from and the parameters to start with, agreed by every rank."""
    latest = torch.tensor([max(checkpoints) if checkpoints else NONE], dtype=torch.int64)
    dist.all_reduce(latest, op=dist.ReduceOp.MIN)  # ranks may differ by one step: each keeps two
    step = int(latest.item())
    if step == NONE:
        return 0, torch.zeros(4, dtype=torch.float64)
    source = torch.tensor([rank if step in checkpoints else NONE], dtype=torch.int64)
    dist.all_reduce(source, op=dist.ReduceOp.MIN)
    params = checkpoints[step].clone() if step in checkpoints else torch.zeros(4, dtype=torch.float64)
    dist.broadcast(params, src=int(source.item()))
    return step + 1, params


def planned_failure() -> tuple[int, int, str] | None:
    """``(rank, step, how)`` of ``TOY_FAIL``, in the first attempt only."""
    spec = os.environ.get("TOY_FAIL", "")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    fail_rank, fail_step, how = spec.split(":")
    return int(fail_rank), int(fail_step), how


def wait_for_peers(rank: int, world: int, step: int, timeout: float = 120.0) -> None:
    """Until every other rank recorded that it entered ``step``'s all-reduce (an event, not a delay)."""
    out = os.environ.get("TOY_OUT")
    deadline = time.monotonic() + timeout
    while out is not None and time.monotonic() < deadline:
        if all(peer == rank or {"event": "entering", "step": step} in records(out, peer) for peer in range(world)):
            return
        time.sleep(0.01)


def records(out: str, rank: int) -> list[dict]:
    """What ``rank`` recorded so far, without the pid and the time."""
    path = os.path.join(out, f"rank{rank}.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        rows = [json.loads(line) for line in handle if line.endswith("\n")]  # a line being written waits
    return [{key: value for key, value in row.items() if key not in ("pid", "t")} for row in rows]


def maybe_fail(rank: int, world: int, step: int) -> None:
    failure = planned_failure()
    if failure is None or (rank, step) != failure[:2]:
        return
    how = failure[2]
    wait_for_peers(rank, world, step)
    time.sleep(float(os.environ.get("TOY_FAIL_DELAY", "0")))
    record(rank, event="failing", how=how, step=step)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"rank {rank} fails at step {step} (TOY_FAIL)")


@launcher.recoverable
def train() -> list[float]:
    dist.init_process_group("gloo")  # reads the new round's RANK, MASTER_PORT... after a recovery
    rank, world = dist.get_rank(), dist.get_world_size()
    start, params = resume_point(rank)
    record(rank, event="start", step=start, restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    pause = float(os.environ.get("TOY_STEP_SLEEP", "0"))
    failure = planned_failure()
    for step in range(start, STEPS):
        maybe_fail(rank, world, step)
        grad = torch.arange(1, 5, dtype=torch.float64) * (rank + 1) * (step + 1) / 1000.0
        try:
            if failure is not None and step == failure[1]:
                # Inside the try: a recovery that interrupts this rank from here on finds it "released".
                record(rank, event="entering", step=step)
            dist.all_reduce(grad)
        except BaseException as exc:  # a peer failed: say when this rank was released, then leave
            try:
                record(rank, event="released", step=step, error=type(exc).__name__)
            except BaseException:
                # launcher's interrupt follows the abort that ended the all-reduce, and may land
                # while the line is written: write it then (the interrupt comes once).
                record(rank, event="released", step=step, error=type(exc).__name__)
            raise
        if step == start:
            record(rank, event="first_collective", step=step)
        params -= 0.1 * grad / world
        checkpoints[step] = params.clone()
        checkpoints.pop(step - 2, None)
        if pause:
            time.sleep(pause)
    dist.destroy_process_group()
    record(rank, event="final", params=params.tolist())
    return params.tolist()


if __name__ == "__main__":
    final = train()
    if os.environ.get("RANK") == "0":
        print("final parameters:", " ".join(f"{value:.6f}" for value in final), file=sys.stderr)
