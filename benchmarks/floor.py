"""The floor of a launcher's start-up: one Python process starting N Python workers, and waiting.

``python floor.py N SCRIPT [ARGS...]`` runs ``python -u SCRIPT ARGS`` N times at once, each with
the variables a launcher's worker gets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), and exits
with the worst status. No rendezvous, store, watchdog, log routing or restarts: nothing a launcher
could skip, so no launcher can start N workers faster than this does (bench_floor.py).
"""

import os
import subprocess
import sys

n, script = int(sys.argv[1]), sys.argv[2]
shared = {**os.environ, "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0",
          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0"}
workers = [subprocess.Popen([sys.executable, "-u", script, *sys.argv[3:]],
                            env={**shared, "RANK": str(rank), "LOCAL_RANK": str(rank)}) for rank in range(n)]
sys.exit(max(worker.wait() for worker in workers))
