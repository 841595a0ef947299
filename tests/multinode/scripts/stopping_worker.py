"""A resumable gloo training loop that beats ``launcher.heartbeat(step)`` every step, in which the
rank named by STOP_RANK stops itself (SIGSTOP, state T) once ``STATE_DIR/stop`` exists, in a round
of three nodes, once in the whole job.

``stopping_worker.py STATE_DIR STEPS STEP_SECONDS``: as ``elastic_worker.py`` (a checkpoint in
the shared STATE_DIR, rank 0 appends one JSON line per step to ``progress.jsonl``), and each rank
writes its pid to ``STATE_DIR/pid.<restart>.<rank>`` so the test can check that none is left.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time

import launcher
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


def claim(state_dir: str) -> bool:
    """Whether this is the only process to stop itself in the whole job (a later round's rank 2
    sees the same ``stop`` file, whatever its restart count)."""
    try:
        os.close(os.open(os.path.join(state_dir, "stop.claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def main() -> int:
    state_dir, steps, step_seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ckpt = os.path.join(state_dir, "ckpt.json")
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    write_json_atomic(os.path.join(state_dir, f"pid.{restart}.{rank}"), os.getpid())
    start = torch.tensor([read_checkpoint(ckpt) + 1 if rank == 0 else 0], dtype=torch.int64)
    dist.broadcast(start, 0)
    stop_rank = int(os.environ.get("STOP_RANK", "-1"))
    three = int(os.environ["GROUP_WORLD_SIZE"]) == 3
    for step in range(int(start.item()), steps):
        launcher.heartbeat(step)
        if rank == stop_rank and three and os.path.exists(os.path.join(state_dir, "stop")) and claim(state_dir):
            write_json_atomic(os.path.join(state_dir, "stopped_at.json"), {"time": time.time(), "pid": os.getpid()})
            os.kill(os.getpid(), signal.SIGSTOP)
        value = torch.tensor([float(rank + 1), float(step)])
        dist.all_reduce(value)
        if rank == 0:
            record = {"step": step, "world": world, "restart": int(restart),
                      "nodes": int(os.environ["GROUP_WORLD_SIZE"]), "time": time.time()}
            with open(os.path.join(state_dir, "progress.jsonl"), "a") as handle:
                handle.write(json.dumps(record) + "\n")
            write_json_atomic(ckpt, {"step": step})
        time.sleep(step_seconds)
    # The end is no hang, however long the others take to get there on a busy machine; nor is
    # the interpreter's teardown (torch's at-exit work), skipped here.
    with launcher.quiet("end of the job", timeout=120):
        dist.barrier()
        dist.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
