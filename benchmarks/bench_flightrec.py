"""What the flight recorder costs per collective: gloo ``all_reduce`` with and without
``TORCH_FR_BUFFER_SIZE`` (what ``--hang-timeout`` sets), and what one dump takes.

Two gloo ranks (plain processes on this host, no launcher: the cost is torch's; ``--backend nccl
--nproc 1`` for one GPU) run ``--iters``
``all_reduce`` of one float and ``--iters / 10`` of 1 MiB, in rounds alternating the buffer off
(``0``) and on (``--buffer``), so the machine's load falls on both alike. Figures: the median over
rounds of each round's mean microseconds per ``all_reduce``, and the milliseconds rank 0 takes
to dump a full buffer (``_dump_fr_trace_json``, what the worker does at a hang).

Usage: ``python benchmarks/bench_flightrec.py [--rounds 5] [--iters 3000] [--buffer 2000]
[--backend gloo|nccl] [--nproc 2] [--json benchmarks/results/flightrec.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKER = """
import json, os, sys, time
import torch
import torch.distributed as dist
iters, backend = int(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])
device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device)
else:
    dist.init_process_group(backend)
sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
small, large = torch.ones(1, device=device), torch.ones(256 * 1024, device=device)
for _ in range(50):
    dist.all_reduce(small)
sync()
result = {}
for name, tensor, count in (("small", small, iters), ("large_1mib", large, max(1, iters // 10))):
    dist.barrier()
    sync()
    start = time.perf_counter()
    for _ in range(count):
        dist.all_reduce(tensor)
    sync()
    result[name] = (time.perf_counter() - start) / count * 1e6
dist.barrier()
if os.environ.get("TORCH_FR_BUFFER_SIZE", "0") != "0":
    from torch._C._distributed_c10d import _dump_fr_trace_json
    start = time.perf_counter()
    raw = _dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    result["dump_ms"] = (time.perf_counter() - start) * 1e3
    result["dump_entries"] = len(json.loads(raw)["entries"])
    result["dump_bytes"] = len(raw)
if dist.get_rank() == 0:
    print(json.dumps(result))
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_round(buffer: int, iters: int, backend: str, nproc: int) -> dict[str, float]:
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": str(nproc), "TORCH_FR_BUFFER_SIZE": str(buffer), "OMP_NUM_THREADS": "1"}
        env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(iters), backend], env=env,
                                      stdout=subprocess.PIPE, text=True))
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise SystemExit(f"a worker failed: {[proc.returncode for proc in procs]}")
    return dict(json.loads(outputs[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--buffer", type=int, default=2000)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="nccl: one rank per GPU, tensors on the GPU (--nproc 1 on a one-GPU machine)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for _ in range(args.rounds):
        for label, buffer in (("off", 0), ("on", args.buffer)):
            rounds[label].append(one_round(buffer, args.iters, args.backend, args.nproc))
    result: dict[str, object] = {"backend": args.backend, "nproc": args.nproc, "rounds": args.rounds,
                                 "iters": args.iters, "buffer": args.buffer,
                                 "cpus": os.cpu_count(), "loadavg": os.getloadavg()[0],
                                 "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    for name in ("small", "large_1mib"):
        off = statistics.median(r[name] for r in rounds["off"])
        on = statistics.median(r[name] for r in rounds["on"])
        result[f"{name}_us_off"], result[f"{name}_us_on"] = round(off, 1), round(on, 1)
        result[f"{name}_us_added"] = round(on - off, 1)
        # The quietest round of each: the load of a shared machine only ever adds.
        result[f"{name}_us_min_off"] = round(min(r[name] for r in rounds["off"]), 1)
        result[f"{name}_us_min_on"] = round(min(r[name] for r in rounds["on"]), 1)
        result[f"{name}_us_each_round"] = {label: [round(r[name], 1) for r in rounds[label]] for label in rounds}
    result["dump_ms"] = round(statistics.median(r["dump_ms"] for r in rounds["on"]), 2)
    result["dump_entries"] = rounds["on"][0]["dump_entries"]
    result["dump_bytes"] = rounds["on"][0]["dump_bytes"]
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
