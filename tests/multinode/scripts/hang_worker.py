"""Every rank heartbeats for a while (50 ms apart: 60 s, or HANG_STEPS beats after a restart); the
rank named by HANG_RANK gets stuck in a known function (with HANG_ONCE, only in the first attempt)."""

from __future__ import annotations

import os
import time

import launcher


def stuck_on_purpose() -> None:
    while True:
        time.sleep(0.5)


def main() -> None:
    rank = int(os.environ["RANK"])
    launcher.heartbeat()
    first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    if rank == int(os.environ.get("HANG_RANK", "-1")) and (first_attempt or not os.environ.get("HANG_ONCE")):
        stuck_on_purpose()
    # The first attempt runs long enough for any hang to be found while the others still run.
    for _ in range(1200 if first_attempt else int(os.environ.get("HANG_STEPS", "1200"))):
        launcher.heartbeat()
        time.sleep(0.05)


if __name__ == "__main__":
    main()
