"""N real agents on one c10d rendezvous: launcher against torchrun, in the same run.

Each of the N agents is a separate process (``python -m launcher`` or ``python -m
torch.distributed.run``, both from the interpreter that runs this script), all started at once
on loopback with ``--nnodes N --nproc-per-node 1 --rdzv-backend c10d``; agent 0 serves the store
(``is_host=1``), the others are clients (``is_host=0``). Each runs one no-op worker that writes
its clock reading first thing. The figure is the time from spawning the first agent to the last
worker's first line (every worker started), median of ``--runs`` runs, the two tools alternating
run by run so that drift on a shared machine hits both alike. The time until every agent has
exited (exit barrier included) is recorded beside it.

Usage: ``python benchmarks/bench_agents.py [--nodes 2 4 8 12] [--runs 3]
[--json benchmarks/results/agents.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NOOP = """
import time
t = time.time()
import os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    f.write(repr(t))
"""

TOOLS = {
    "launcher": ["-m", "launcher"],
    "torchrun": ["-m", "torch.distributed.run"],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # cached bytecode, as on a user's machine
    return env


def run_once(tool: str, nodes: int, work: Path, timeout: float) -> tuple[float, float]:
    """(spawn -> every worker started, spawn -> every agent exited), in seconds."""
    out = Path(tempfile.mkdtemp(dir=work))
    port = free_port()
    run_id = f"bench-{tool}-{nodes}-{port}"
    procs = []
    start = time.time()
    for index in range(nodes):
        cmd = [
            sys.executable, *TOOLS[tool],
            "--nnodes", str(nodes),
            "--nproc-per-node", "1",
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", run_id,
            "--rdzv-conf", f"is_host={1 if index == 0 else 0}",
            "--monitor-interval", "0.1",
            str(work / "noop.py"), str(out),
        ]
        procs.append(subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    errors = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=max(1.0, start + timeout - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            errors.append(f"exit status {proc.returncode}: " + err.decode(errors="replace")[-1500:])
    ended = time.time()
    if errors:
        raise RuntimeError(f"{tool} with {nodes} agents failed:\n{errors[0]}")
    starts = [float((out / str(rank)).read_text()) for rank in range(nodes)]
    return max(starts) - start, ended - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[2, 4, 8, 12])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "agents.json"))
    args = parser.parse_args()
    results: dict[str, object] = {
        "title": "N agents (separate processes, one no-op worker each) on one c10d rendezvous, loopback",
        "metric": "spawn -> every worker started (s), median",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "runs": args.runs,
        "nodes": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "noop.py").write_text(NOOP)
        run_once("launcher", 2, work, args.timeout)  # warm the page cache for both
        run_once("torchrun", 2, work, args.timeout)
        for nodes in args.nodes:
            samples: dict[str, list[tuple[float, float]]] = {"launcher": [], "torchrun": []}
            failed: dict[str, str] = {}
            for _ in range(args.runs):
                for tool in ("launcher", "torchrun"):
                    if tool in failed:
                        continue
                    try:
                        samples[tool].append(run_once(tool, nodes, work, args.timeout))
                    except RuntimeError as exc:  # recorded, not fatal: the other tool's figure stands
                        failed[tool] = str(exc).splitlines()[0]
            row: dict[str, object] = {}
            for tool, values in samples.items():
                if tool in failed:
                    row[f"{tool}_started"] = None
                    row[f"{tool}_error"] = f"{failed[tool]} (did not finish within {args.timeout:g} s?)"
                    continue
                row[f"{tool}_started"] = round(statistics.median(v[0] for v in values), 3)
                row[f"{tool}_exited"] = round(statistics.median(v[1] for v in values), 3)
                row[f"{tool}_samples"] = [[round(a, 3), round(b, 3)] for a, b in values]
            ours, theirs = row["launcher_started"], row["torchrun_started"]
            row["ratio_started"] = round(float(ours) / float(theirs), 3) if ours and theirs else None  # type: ignore[arg-type]
            results["nodes"][str(nodes)] = row  # type: ignore[index]
            print(f"N={nodes:3d}  " + "  ".join(
                f"{tool} {row[tool + '_started']} s" for tool in ("launcher", "torchrun")
            ) + f"  ratio {row['ratio_started']}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
