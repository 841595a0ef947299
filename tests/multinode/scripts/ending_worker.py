"""A worker for the end-of-job tests: the group forms, then each rank works alone for a while.

Every rank joins the gloo group, makes one all_reduce, prints ``rank R ready``, leaves the group
and then "works" (sleeps) without further collectives, so that one node can finish, fail or
vanish while the others run, and no rank fails merely because a peer went away.

``MN_GROUP=store``: the group forms without torch instead, as a barrier of every rank on the
job's worker store (``MASTER_ADDR:MASTER_PORT``, served by the agents) through launcher's
pure-Python store client. The ending is the same (the group is left before any node ends), and
a worker starts in a tenth of the time: tests about endings use it, keeping one gloo job per
scenario.

``MN_RUN``: how long each rank works, ``RANK:SECONDS`` pairs and a default ``*:SECONDS``
(``0:0,1:0,*:600``: ranks 0 and 1 finish at once, the others run for ten minutes).
``MN_FAIL_RANK`` (a global rank) then exits with ``MN_FAIL_CODE`` instead of 0, after writing
``boom: rank R gives up (exit C)`` to stderr, as a rank failing in its post-training code would.
``MN_GO=PATH``: once the group formed, each rank waits until PATH exists before it works.
With ``MN_FAIL_AFTER_EXITS=DIR`` (an empty directory of its own) and ``MN_FINISHERS=0,1``, it
fails only once those ranks have exited and a second more has passed (their agents then wait at
their exit barriers), however slow the machine: each rank writes its pid to DIR once ready.
"""

from __future__ import annotations

import datetime
import os
import sys
import time


def run_seconds(rank: int) -> float:
    table = dict(item.split(":", 1) for item in os.environ.get("MN_RUN", "*:0").split(",") if item)
    return float(table.get(str(rank), table.get("*", "0")))


def form_gloo_group(timeout: float) -> int:
    """Join the gloo group, make one all_reduce, leave the group; this worker's rank."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(1))
    # Local only for gloo; without it gloo may abort the process at exit.
    dist.destroy_process_group()
    return rank


def form_store_group(timeout: float) -> int:
    """Wait until every rank of this attempt has arrived, on the worker store; this worker's rank."""
    from launcher.store.client import TCPStoreClient

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # A restart meets the same store again: its barrier is a new one.
    key = f"mn-ending/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    with TCPStoreClient(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=timeout) as store:
        if store.add(f"{key}/arrived", 1) == world:
            store.set(f"{key}/formed", b"1")
        store.wait([f"{key}/formed"])
    return rank


def main() -> int:
    timeout = float(os.environ.get("MN_PG_TIMEOUT", "60"))
    rank = form_store_group(timeout) if os.environ.get("MN_GROUP") == "store" else form_gloo_group(timeout)
    print(f"rank {rank} ready", flush=True)
    go = os.environ.get("MN_GO")
    while go and not os.path.exists(go):  # the test says when to work (an event, not a delay)
        time.sleep(0.05)
    pids = os.environ.get("MN_FAIL_AFTER_EXITS")
    if pids:
        with open(os.path.join(pids, f"{rank}.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(pids, f"{rank}.tmp"), os.path.join(pids, str(rank)))
    time.sleep(run_seconds(rank))
    if rank == int(os.environ.get("MN_FAIL_RANK", "-1")):
        if pids:
            finishers = [r for r in os.environ.get("MN_FINISHERS", "").split(",") if r]
            _wait_until_gone(pids, finishers)
            time.sleep(1.0)
        code = int(os.environ.get("MN_FAIL_CODE", "7"))
        if os.environ.get("MN_FAIL_MARK"):  # when it failed, for benchmarks/bench_endings.py
            with open(os.environ["MN_FAIL_MARK"], "w") as mark:
                mark.write(repr(time.time()))
        sys.stderr.write(f"boom: rank {rank} gives up (exit {code})\n")
        sys.stderr.flush()
        os._exit(code)  # at once: the mark above is when it failed
    return 0


def _wait_until_gone(directory: str, ranks: list[str]) -> None:
    """Until every rank of ``ranks`` has written its pid in ``directory`` and exited."""
    while True:
        paths = [os.path.join(directory, r) for r in ranks]
        if all(os.path.exists(p) for p in paths):
            alive = 0
            for path in paths:
                with open(path) as f:
                    try:
                        os.kill(int(f.read()), 0)
                        alive += 1
                    except ProcessLookupError:
                        pass
            if not alive:
                return
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
