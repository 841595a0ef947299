"""A training-like worker for failure tests: all_reduce in a loop; one chosen rank fails.

``MN_FAIL_RANK`` (global rank, -1 for none) exits with ``MN_FAIL_CODE`` after writing a line to
stderr, ``MN_FAIL_AFTER`` seconds after the group formed. The others keep all-reducing until a
collective fails (a peer died) or they are stopped. Every rank prints ``rank R ready`` once the
group has formed, so tests know when to pull the plug. Ranks listed in ``MN_EXIT_RANKS``
(``2,3``) exit 0 right after that, as if their share of the work were done.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    timeout = datetime.timedelta(seconds=float(os.environ.get("MN_PG_TIMEOUT", "60")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(1))
    print(f"rank {rank} ready", flush=True)
    if str(rank) in os.environ.get("MN_EXIT_RANKS", "").split(","):
        # Without it gloo may abort the process at exit ("terminate called without an active exception").
        dist.destroy_process_group()
        return 0
    fail_rank = int(os.environ.get("MN_FAIL_RANK", "-1"))
    fail_at = time.monotonic() + float(os.environ.get("MN_FAIL_AFTER", "1"))
    while True:
        if rank == fail_rank and time.monotonic() >= fail_at:
            sys.stderr.write(f"boom: rank {rank} gives up (exit {os.environ.get('MN_FAIL_CODE', '7')})\n")
            sys.stderr.flush()
            os._exit(int(os.environ.get("MN_FAIL_CODE", "7")))
        if rank != fail_rank:
            dist.all_reduce(torch.ones(1))
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
