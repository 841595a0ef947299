"""The GPU lane's job: one script, several modes, the same under launcher and under torchrun.

Each process appends what happened to ``$LANE_STAMPS`` (one JSON object a line: ``event``, ``t``
(``time.time()``), ``pid``, ``rank``, ``restart`` and the event's own fields), so the tests and
the figures read times from the ranks themselves, not from their output.

Modes (``--mode``):

- ``first``: initialise the process group, one ``all_reduce``, wait for it on the device, stamp
  ``first_allreduce``. With ``--fail-first`` the first attempt then stamps ``failing`` and exits 1
  (the replacement's ``first_allreduce`` ends the restart).
- ``ddp``: the issue's DDP loop (``Linear(2048, 2048)``, SGD, ten steps then
  ``launcher.heartbeat(step)``) until ``--seconds`` pass or the file ``--go`` exists; ``--slow-rank``
  sleeps ``--slow`` seconds a step on that rank (a straggler); stamps ``ddp`` with the steps and,
  under ``--straggler-detection``, the rank's straggler slot as its worker wrote it.
- ``loop``: no DDP: a matrix product, then a blocking ``all_reduce`` of a tensor on the device and
  ``launcher.heartbeat(step)``, until ``--seconds`` pass; ``--slow-rank`` sleeps ``--slow`` seconds
  a step before its ``all_reduce`` (the others wait for it inside theirs). Stamps ``loop`` with the slot.
- ``recover``: a CUDA tensor made outside a ``launcher.recoverable`` function; the first call
  raises at step 3 (``failing``), the next call stamps ``first_allreduce`` with the tensor's address.
- ``hang``: beats for a while, then waits in ``torch.cuda.synchronize()`` behind a kernel that
  runs for minutes (``--hang-collective``: after queuing an ``all_reduce`` behind it; rank 1 only
  with ``--stall-rank``, which instead sleeps before entering its sixth ``all_reduce``).

``--backend gloo --device cpu`` runs the same on a CPU (the lane's figure script, tried without a GPU).
"""

import argparse
import json
import os
import sys
import time

PRELOADED = "torch" in sys.modules  # before this script imports it: a --preload torch template did

import launcher  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def stamp(event, **fields):
    path = os.environ.get("LANE_STAMPS")
    if not path:
        return
    row = {"event": event, "t": time.time(), "pid": os.getpid(), "rank": int(os.environ.get("RANK", "0")),
           "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), **fields}
    with open(path, "a") as handle:
        handle.write(json.dumps(row) + "\n")


def device(options):
    if options.device == "cpu":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    # Two ranks on one GPU (gloo on CUDA tensors): both use the one device there is.
    index = local % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init(options, where):
    if options.backend == "nccl":
        dist.init_process_group("nccl", device_id=where)
    else:
        dist.init_process_group(options.backend)


def settle(where):
    if where.type == "cuda":
        torch.cuda.synchronize(where)


def straggler_slot():
    """This rank's straggler slot as its worker wrote it (``None`` without --straggler-detection)."""
    import struct

    path, slot = os.environ.get("LAUNCHER_STRAGGLER_FILE"), os.environ.get("LAUNCHER_STRAGGLER_SLOT")
    if not path or slot is None:
        return None
    with open(path, "rb") as handle:
        handle.seek(64 * int(slot))
        data = handle.read(64)
    wait, entered, collectives, step, steps, _, gpu_collectives, gpu_pending = struct.unpack("<ddqqqdqq", data)
    return {"wait": wait, "entered": entered, "collectives": collectives, "steps": steps,
            "gpu_collectives": gpu_collectives, "gpu_pending": gpu_pending}


def mode_first(options):
    where = device(options)
    init(options, where)
    value = torch.ones(1024, device=where)
    dist.all_reduce(value)
    settle(where)
    stamp("first_allreduce", preloaded=PRELOADED, value=float(value[0]))
    if options.fail_first and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        stamp("failing")
        sys.stdout.flush()
        os._exit(1)
    dist.destroy_process_group()


def mode_ddp(options):
    where = device(options)
    init(options, where)
    rank = dist.get_rank()
    module = torch.nn.Linear(options.width, options.width).to(where)
    ids = [where.index] if where.type == "cuda" else None
    model = torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(options.width, options.width, device=where)
    stamp("ready")
    start = time.time()
    end = start + options.seconds
    step = 0
    while time.time() < end and not (options.go and os.path.exists(options.go)):
        for _ in range(10):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            if rank == options.slow_rank and options.slow:
                time.sleep(options.slow)
        settle(where)
        step += 1
        launcher.heartbeat(step)
    stamp("ddp", steps=step, seconds=time.time() - start, slot=straggler_slot())
    dist.destroy_process_group()


def mode_loop(options):
    where = device(options)
    init(options, where)
    rank = dist.get_rank()
    a = torch.randn(options.width, options.width, device=where)
    grad = torch.zeros(options.width, device=where)
    start = time.time()
    step = 0
    while time.time() < start + options.seconds:
        grad += (a @ a).sum(dim=0)
        if rank == options.slow_rank and options.slow:
            time.sleep(options.slow)
        dist.all_reduce(grad)
        grad.zero_()
        step += 1
        launcher.heartbeat(step)
        if step % 10 == 0:
            settle(where)  # as a training loop's logging would: the host stays near the GPU
    settle(where)
    stamp("loop", steps=step, seconds=time.time() - start, slot=straggler_slot())
    dist.destroy_process_group()


def mode_recover(options):
    where = device(options)
    kept = torch.arange(16, dtype=torch.float32, device=where)  # outside the function: survives in place
    address = kept.data_ptr()
    calls = []

    @launcher.recoverable
    def train():
        calls.append(1)
        init(options, where)
        value = torch.ones(256, device=where)
        for step in range(6):
            if len(calls) == 1 and step == 3:
                settle(where)
                stamp("failing", step=step)
                raise RuntimeError("the lane's rank raises at step 3 of its first call")
            dist.all_reduce(value)
            if step == 0:
                settle(where)
                intact = bool(torch.equal(kept, torch.arange(16, dtype=torch.float32, device=where)))
                stamp("first_allreduce", call=len(calls), address=kept.data_ptr(),
                      same_address=kept.data_ptr() == address, intact=intact)
        dist.destroy_process_group()

    train()
    stamp("done", calls=len(calls))


def mode_hang(options):
    where = device(options)
    init(options, where)
    rank = dist.get_rank()
    value = torch.ones(64, device=where)
    for step in range(1, 6):
        dist.all_reduce(value)
        settle(where)
        launcher.heartbeat(step)
    if options.stall_rank is not None:
        if rank == options.stall_rank:
            stamp("stalling")
            time.sleep(600)  # never enters the sixth all_reduce
        stamp("entering", collective=6)
        dist.all_reduce(value)
        settle(where)
        return
    stamp("stuck")
    torch.cuda._sleep(2**62)  # a kernel that spins for far longer than the test
    if options.hang_collective:
        dist.all_reduce(value)
    torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("first", "ddp", "loop", "recover", "hang"), required=True)
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--fail-first", action="store_true")
    parser.add_argument("--seconds", type=float, default=9.0)
    parser.add_argument("--go")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--stall-rank", type=int)
    parser.add_argument("--hang-collective", action="store_true")
    options = parser.parse_args()
    modes = {"first": mode_first, "ddp": mode_ddp, "loop": mode_loop, "recover": mode_recover, "hang": mode_hang}
    modes[options.mode](options)


if __name__ == "__main__":
    main()
