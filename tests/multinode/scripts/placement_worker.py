"""Prints where the launcher placed this worker (no torch: only the ranks are under test)."""

import os

print(f"placed RANK={os.environ['RANK']} GROUP_RANK={os.environ['GROUP_RANK']} "
      f"WORLD_SIZE={os.environ['WORLD_SIZE']}", flush=True)
