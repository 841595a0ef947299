"""How long ``--nproc-per-node auto`` takes to resolve: launcher beside torchrun.

Each case runs in a fresh interpreter, as a launcher start does:

``launcher, NVML present``
    ``resolve_nproc_per_node("auto", get_plugin_manager())`` with a stand-in ``pynvml`` (four GPUs)
    first on ``PYTHONPATH``; this machine has no GPU, so the module answers like one would.
``launcher, NVML absent``
    the same with ``import pynvml`` failing, so the cuda provider falls back to torch's build
    information.
``torchrun``
    ``torch.distributed.run.determine_local_world_size("auto")``, which imports torch.

Runs alternate between the cases (one of each per round) so that load from other processes
spreads evenly, and the median of the rounds is reported: the wall time of the whole process and
the time inside it from before the first import to the answer. ``python -c pass`` is measured
the same way as the floor.

Usage: ``python benchmarks/bench_nproc_auto.py [--rounds N]``; writes
``benchmarks/results/nproc_auto.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "nproc_auto.json"

FAKE_PYNVML = textwrap.dedent(
    '''
    """Stand-in for nvidia-ml-py's pynvml reporting four GPUs (benchmark only)."""
    NVML_DEVICE_MIG_ENABLE = 1


    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(value)
            self.value = value


    class _Pci:
        def __init__(self, bus_id):
            self.busId = bus_id


    _BUS = ["00000000:18:00.0", "00000000:3B:00.0", "00000000:86:00.0", "00000000:AF:00.0"]


    def nvmlInit():
        pass


    def nvmlShutdown():
        pass


    def nvmlDeviceGetCount():
        return len(_BUS)


    def nvmlDeviceGetHandleByIndex(index):
        return index


    def nvmlDeviceGetUUID(handle):
        return "GPU-%08x-0000-0000-0000-000000000000" % handle


    def nvmlDeviceGetPciInfo(handle):
        return _Pci(_BUS[handle])
    '''
)

LAUNCHER = """
import time
start = time.perf_counter()
import json, os, sys
if os.environ.get("BENCH_BLOCK_PYNVML"):
    sys.modules["pynvml"] = None
from launcher.plugins.manager import get_plugin_manager
from launcher.devices import resolve_nproc_per_node
count, provider = resolve_nproc_per_node("auto", get_plugin_manager())
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "count": count, "device": provider.name,
                  "torch_imported": "torch" in sys.modules}))
"""

TORCHRUN = """
import time
start = time.perf_counter()
import json, logging, sys
logging.disable(logging.CRITICAL)
from torch.distributed.run import determine_local_world_size
count = determine_local_world_size("auto")
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "count": count, "device": None, "torch_imported": True}))
"""

FLOOR = """
import json
print(json.dumps({"seconds": 0.0, "count": None, "device": None, "torch_imported": False}))
"""


def run_once(code: str, env: dict[str, str]) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"benchmark case failed:\n{done.stderr}")
    return wall, json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="runs of each case (at least 5)")
    args = parser.parse_args()
    rounds = max(5, args.rounds)

    base_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH")}
    base_env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as fake_dir:
        Path(fake_dir, "pynvml.py").write_text(FAKE_PYNVML)
        path = os.pathsep.join(p for p in (fake_dir, base_env["PYTHONPATH"]) if p)
        with_nvml = dict(base_env, PYTHONPATH=path)
        without_nvml = dict(base_env, BENCH_BLOCK_PYNVML="1")
        cases = {
            "python -c pass (floor)": (FLOOR, base_env),
            "launcher auto, NVML present": (LAUNCHER, with_nvml),
            "launcher auto, NVML absent": (LAUNCHER, without_nvml),
            "torchrun determine_local_world_size(auto)": (TORCHRUN, base_env),
        }
        walls: dict[str, list[float]] = {name: [] for name in cases}
        inner: dict[str, list[float]] = {name: [] for name in cases}
        answers: dict[str, dict[str, object]] = {}
        for code, env in cases.values():  # warm the file cache once, unmeasured
            run_once(code, env)
        for _ in range(rounds):
            for name, (code, env) in cases.items():
                wall, answer = run_once(code, env)
                walls[name].append(wall)
                inner[name].append(float(answer.pop("seconds")))  # type: ignore[arg-type]
                answers[name] = answer

    rows = []
    for name in cases:
        rows.append(
            {
                "case": name,
                "process_wall_s_median": statistics.median(walls[name]),
                "in_process_s_median": statistics.median(inner[name]),
                "process_wall_s_runs": walls[name],
                "in_process_s_runs": inner[name],
                **answers[name],
            }
        )

    print(f"--nproc-per-node auto, median of {rounds} alternating runs, fresh interpreter each")
    header = f"{'case':<44} {'process wall':>13} {'in-process':>11}  {'answer':<12} torch imported"
    print(header)
    print("-" * len(header))
    for row in rows:
        answer = "" if row["count"] is None else f"{row['count']} {row['device'] or ''}".strip()
        print(
            f"{row['case']:<44} {row['process_wall_s_median'] * 1000:>10.1f} ms "
            f"{row['in_process_s_median'] * 1000:>8.1f} ms  {answer:<12} {row['torch_imported']}"
        )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "nproc_per_node_auto",
                "rounds": rounds,
                "python": platform.python_version(),
                "machine": {"cpus_allowed": len(os.sched_getaffinity(0)), "platform": platform.platform()},
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
