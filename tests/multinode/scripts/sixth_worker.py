"""Five gloo all_reduces with a heartbeat each; then the rank named by LATE_RANK sleeps while the
others wait in the sixth (a hang the flight recorder blames on LATE_RANK)."""

from __future__ import annotations

import datetime
import os
import time

import launcher
import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    value = torch.ones(4)
    for step in range(5):
        dist.all_reduce(value)
        launcher.heartbeat(step)
    if dist.get_rank() == int(os.environ["LATE_RANK"]):
        time.sleep(120)
    dist.all_reduce(value)


if __name__ == "__main__":
    main()
