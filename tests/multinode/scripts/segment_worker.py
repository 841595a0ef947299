"""A worker that says where it runs, then waits for the test to let it finish (no torch).

``segment_worker.py STATE ADDRESS``: appends ``ADDRESS GROUP_RANK WORLD_SIZE`` to STATE/placed.txt,
then exits 0 once STATE/finish exists.
"""

import os
import sys
import time
from pathlib import Path

state, address = Path(sys.argv[1]), sys.argv[2]
with open(state / "placed.txt", "a") as placed:  # one short append a worker: lines do not interleave
    placed.write(f"{address} {os.environ['GROUP_RANK']} {os.environ['WORLD_SIZE']}\n")
while not (state / "finish").exists():
    time.sleep(0.1)
