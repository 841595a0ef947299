"""What a checkpoint's automatic quiet section costs (``--hang-timeout``, issue 46).

Under ``--hang-timeout`` the workers' start-up hook (``launcher/stragglers/timing.py``) wraps
``torch.save`` and ``torch.distributed.checkpoint``'s saves and loads: each call on the main
thread opens a quiet section in the rank's heartbeat slot and closes it (two stores at each end,
a thread check, two clock reads). Nothing else is wrapped, so outside a checkpoint nothing is
paid. Measured here, in one process that loads the hook exactly as a worker does and maps a real
heartbeat slot, medians of alternating rounds:

- ``torch_save_us``: ``torch.save`` of a small state dict (a ``Linear(8, 2)``'s) into an
  ``io.BytesIO``, wrapped and unwrapped (the wrapper's ``__wrapped__``): the smallest checkpoint,
  where the section's share is the largest;
- ``section_us``: the wrapper around a function that does nothing (the section's own work).

Usage: ``python benchmarks/bench_checkpoint_sections.py [--rounds 7] [--calls 2000] [--json FILE]``
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

# The hook loaded as in a worker, and the per-call timer: the same as for the progress hooks'
# cost (run as a script, this folder is on the path).
from bench_progress_hooks import _load_hook, _per_call

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "core"))
    from launcher.hangs.heartbeat import unpack_checkpoints
    from launcher.hangs.watch import HeartbeatTable

    with tempfile.TemporaryDirectory() as tmp:
        table = HeartbeatTable(os.path.join(tmp, "beats"), 1)
        hook = _load_hook(table.path)
        import torch

        state = torch.nn.Linear(8, 2).state_dict()
        wrapped = torch.save
        assert getattr(wrapped, "_launcher_checkpoint", False), "torch.save is not wrapped"
        plain = wrapped.__wrapped__
        _per_call(lambda: wrapped(state, io.BytesIO()), args.calls // 4)  # warm-up
        wrapped_us, plain_us = [], []
        for number in range(args.rounds):  # alternating which goes first: drift hits both alike
            for is_wrapped in (True, False) if number % 2 else (False, True):
                function = wrapped if is_wrapped else plain
                (wrapped_us if is_wrapped else plain_us).append(
                    _per_call(lambda f=function: f(state, io.BytesIO()), args.calls))
        empty = hook._checkpoint_section(lambda: None)
        section = statistics.median(_per_call(empty, args.calls * 10) for _ in range(args.rounds))
        counted = unpack_checkpoints(table.copy(), 0)[1]
        table.close()

    difference = statistics.median(wrapped_us) - statistics.median(plain_us)
    figures = {
        "python": sys.version.split()[0], "torch": torch.__version__, "rounds": args.rounds, "calls": args.calls,
        "load_average": round(os.getloadavg()[0], 2),
        "torch_save_us": {"wrapped": round(statistics.median(wrapped_us), 2),
                          "plain": round(statistics.median(plain_us), 2), "difference": round(difference, 2)},
        "section_us": round(section, 3),
        "checkpoints_counted": counted,
    }
    print(f"torch.save of a Linear(8, 2) state dict into BytesIO: {figures['torch_save_us']['wrapped']} us wrapped, "
          f"{figures['torch_save_us']['plain']} us plain ({difference:+.2f} us); the section alone {section:.3f} us")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
