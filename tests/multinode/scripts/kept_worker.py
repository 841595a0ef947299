"""A standard-library worker under ``launcher.recoverable``, for tests of an in-place recovery.

Prints ``rank R ready (restart N)``, then idles. The rank ``MN_FAIL_RANK`` raises once the file
``MN_FAIL_FILE`` exists, in restart 0 only: its agent recovers in place, keeping every other
local worker's process for the next round.
"""

from __future__ import annotations

import os
import time

import launcher


@launcher.recoverable
def main() -> None:
    rank, restart = int(os.environ["RANK"]), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"rank {rank} ready (restart {restart})", flush=True)
    fail = os.environ.get("MN_FAIL_FILE", "")
    while True:
        if restart == "0" and rank == int(os.environ.get("MN_FAIL_RANK", "-1")) and fail and os.path.exists(fail):
            raise RuntimeError(f"rank {rank} gives up")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
