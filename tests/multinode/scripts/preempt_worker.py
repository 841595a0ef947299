"""A training loop that saves on launcher's preemption notice (tests/multinode/test_preemption.py).

Each rank joins a gloo group (one all_reduce: a real job), writes ``ready-<rank>``, then takes
20 ms steps. Once ``launcher.preempted()`` says so it writes ``seen-<rank>`` (the wall-clock
time it saw the notice and the seconds left), saves ``ckpt-<rank>`` (its step) and exits 0. The
rank named by ``IGNORE_RANK`` never looks, and keeps running until it is stopped.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import launcher
import torch
import torch.distributed as dist


def main() -> None:
    state = Path(os.environ["STATE_DIR"])
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    assert int(value.item()) == dist.get_world_size()
    ignores = rank == int(os.environ.get("IGNORE_RANK", "-1"))
    (state / f"ready-{rank}").write_text(str(os.getpid()))
    step = 0
    while True:
        if not ignores and launcher.preempted():
            seen = time.time()
            left = launcher.preemption_time_left()
            (state / f"seen-{rank}").write_text(json.dumps({"time": seen, "left": left}))
            (state / f"ckpt-{rank}").write_text(json.dumps({"step": step}))
            print(f"rank {rank} saved at step {step}", flush=True)
            # Leave at once: destroying the group would wait for a peer that ignores the notice
            # (IGNORE_RANK), and leaving it to the interpreter's exit may abort (docs/failures.md).
            os._exit(0)
        step += 1
        time.sleep(0.02)


if __name__ == "__main__":
    main()
