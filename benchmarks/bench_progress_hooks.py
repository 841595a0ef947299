"""What counting progress without code costs the worker (``--hang-timeout``, issue 46).

Under ``--hang-timeout`` the workers' start-up hook (``launcher/stragglers/timing.py``) stores a
heartbeat at every optimizer step (torch's global step post-hook) and every completed collective
(a wrapper around ``torch.distributed``'s blocking collectives). Measured here, in one process
that loads the hook exactly as a worker does and maps a real heartbeat slot:

- ``optimizer_step_us``: ``opt.step()`` of a tiny SGD (one parameter of 16 floats), with the
  hook registered and without (the hook's handle removed), medians of alternating rounds; and
  ``optimizer_hook_us``, the hook function alone;
- ``collective_us``: ``all_reduce`` of one float on a one-rank gloo group, wrapped and unwrapped
  (the wrapper's ``__wrapped__``), medians of alternating rounds; and ``collective_wrapper_us``,
  the wrapper's own work (``enter()`` + ``leave()``) alone;
- each cost as a share of a 10 ms step (the issue's goal: at most 1%).

Without ``--straggler-detection`` the wrapper only beats (two clock reads, one store); with it
it also times the wait (what ``bench_stragglers.py`` measures).

Usage: ``python benchmarks/bench_progress_hooks.py [--rounds 7] [--calls 20000] [--json FILE]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEP_S = 0.010


def _load_hook(path: str):
    os.environ["LAUNCHER_HEARTBEAT_FILE"] = path
    os.environ["LAUNCHER_HEARTBEAT_SLOT"] = "0"
    os.environ["LAUNCHER_HEARTBEAT_PID"] = str(os.getpid())
    spec = importlib.util.spec_from_file_location("_launcher_straggler_timing",
                                                  ROOT / "core" / "launcher" / "stragglers" / "timing.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.install()
    return module


def _per_call(function, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "core"))
    from launcher.hangs.watch import HeartbeatTable

    with tempfile.TemporaryDirectory() as tmp:
        table = HeartbeatTable(os.path.join(tmp, "beats"), 1)
        hook = _load_hook(table.path)
        import torch
        import torch.distributed as dist
        import torch.optim.optimizer as optimizer_module

        param = torch.nn.Parameter(torch.zeros(16))
        param.grad = torch.ones(16)
        opt = torch.optim.SGD([param], lr=1e-6)
        handle = optimizer_module._launcher_step_hook
        _per_call(opt.step, args.calls)  # warm-up
        with_hook, without_hook = [], []
        for number in range(args.rounds):  # alternating which goes first: drift hits both alike
            for hooked in (True, False) if number % 2 else (False, True):
                if not hooked:
                    handle.remove()
                (with_hook if hooked else without_hook).append(_per_call(opt.step, args.calls))
                if not hooked:
                    handle = optimizer_module.register_optimizer_step_post_hook(hook.optimizer_stepped)
        hook_alone = statistics.median(
            _per_call(lambda: hook.optimizer_stepped(opt, (), {}), args.calls) for _ in range(args.rounds))
        steps_seen = table.read_all()[0][4]

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        value = torch.zeros(1)
        wrapped = dist.all_reduce
        plain = wrapped.__wrapped__
        _per_call(lambda: wrapped(value), args.calls // 4)  # warm-up
        wrapped_us, plain_us = [], []
        for number in range(args.rounds):
            for is_wrapped in (True, False) if number % 2 else (False, True):
                (wrapped_us if is_wrapped else plain_us).append(
                    _per_call(lambda w=is_wrapped: (wrapped if w else plain)(value), args.calls // 4))
        wrapper_alone = statistics.median(
            _per_call(lambda: hook.leave(hook.enter()), args.calls) for _ in range(args.rounds))
        dist.destroy_process_group()
        table.close()

    step_cost = statistics.median(with_hook) - statistics.median(without_hook)
    collective_cost = statistics.median(wrapped_us) - statistics.median(plain_us)
    figures = {
        "python": sys.version.split()[0], "torch": torch.__version__, "rounds": args.rounds, "calls": args.calls,
        "optimizer_step_us": {"with_hook": round(statistics.median(with_hook), 2),
                              "without_hook": round(statistics.median(without_hook), 2),
                              "difference": round(step_cost, 2)},
        "optimizer_hook_us": round(hook_alone, 3),
        "collective_us": {"wrapped": round(statistics.median(wrapped_us), 2),
                          "plain": round(statistics.median(plain_us), 2),
                          "difference": round(collective_cost, 2)},
        "collective_wrapper_us": round(wrapper_alone, 3),
        "share_of_10ms_step_percent": {
            "optimizer_step": round(max(step_cost, hook_alone) / (STEP_S * 1e6) * 100, 4),
            "collective": round(max(collective_cost, wrapper_alone) / (STEP_S * 1e6) * 100, 4),
        },
        "optimizer_steps_counted": steps_seen,
    }
    print(f"optimizer step: {figures['optimizer_step_us']['with_hook']} us with the hook, "
          f"{figures['optimizer_step_us']['without_hook']} us without ({step_cost:+.2f} us); the hook alone "
          f"{hook_alone:.3f} us")
    print(f"all_reduce of one float, one gloo rank: {figures['collective_us']['wrapped']} us wrapped, "
          f"{figures['collective_us']['plain']} us plain ({collective_cost:+.2f} us); the wrapper alone "
          f"{wrapper_alone:.3f} us")
    share = figures["share_of_10ms_step_percent"]
    print(f"share of a 10 ms step: {share['optimizer_step']:.4f}% per optimizer step, "
          f"{share['collective']:.4f}% per collective (the larger of the difference and the hook alone)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
