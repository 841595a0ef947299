"""A training-like worker for failure tests: all_reduce in a loop; one chosen rank fails.

``MN_FAIL_RANK`` (global rank, -1 for none) exits with ``MN_FAIL_CODE`` after writing a line to
stderr, ``MN_FAIL_AFTER`` seconds after the group formed. The others keep all-reducing until a
collective fails (a peer died) or they are stopped. Every rank prints ``rank R ready`` once the
group has formed, so tests know when to pull the plug. Ranks listed in ``MN_EXIT_RANKS``
(``2,3``) exit 0 right after that, as if their share of the work were done.

With ``MN_FAIL_AFTER_EXITS`` (an empty directory of its own) the job fails strictly after those ranks have ended:
they write their pid there first; the others make no further collective (one would fail as soon
as the exiting ranks close their connections, which they do while still running) but wait until
every one of those processes is gone (reaped by its agent), then the lowest of them exits 1 and
the rest wait to be stopped.
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
    exit_ranks = {int(r) for r in os.environ.get("MN_EXIT_RANKS", "").split(",") if r}
    pids = os.environ.get("MN_FAIL_AFTER_EXITS")
    if rank in exit_ranks:
        if pids:
            with open(os.path.join(pids, str(rank)), "w") as f:
                f.write(str(os.getpid()))
        # Without it gloo may abort the process at exit ("terminate called without an active exception").
        dist.destroy_process_group()
        return 0
    if pids:
        _wait_until_gone(pids, len(exit_ranks))
        if rank == min(set(range(dist.get_world_size())) - exit_ranks):
            sys.stderr.write(f"boom: rank {rank} gives up once the finished ranks are gone\n")
            sys.stderr.flush()
            os._exit(1)
        time.sleep(600)
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


def _wait_until_gone(directory: str, count: int) -> None:
    """Until ``count`` pids are written in ``directory`` and none of those processes exists."""
    while True:
        names = os.listdir(directory)
        pids = []
        for name in names:
            with open(os.path.join(directory, name)) as f:
                pids.append(int(f.read() or 0))  # empty: being written
        if len(names) >= count and all(pid and not _exists(pid) for pid in pids):
            return
        time.sleep(0.05)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


if __name__ == "__main__":
    sys.exit(main())
