"""What ``launcher status --rdzv-endpoint`` costs, and what reading costs the job's store.

A 2-node c10d job on this host (two agents, ``--nproc-per-node 32`` each: 64 ranks, workers that
wait), its rendezvous store guarded by a secret (``LAUNCHER_RDZV_SECRET``). Then:

- ``status_rdzv_command_wall_s``: ``launcher status --rdzv-endpoint ... --rdzv-id ... --json`` as a
  command (interpreter start, plugin discovery, connecting and proving the secret included),
  median of ``--runs``; ``status_rdzv_in_process_s``: the same read in-process (connect, prove,
  read the round and the two nodes' records, merge 64 ranks).
- ``store_get_*``: the latency of a GET on the rendezvous store by another client (what an agent's
  rendezvous calls see), median and 99th percentile of ``--ops`` GETs, idle and while a reader
  reads the status back to back without pause (far more often than anyone would), alternated.
- ``store_host_cpu_*``: the CPU of the agent that serves the store, idle and under that reader.

Usage: ``.tox/py3/bin/python benchmarks/bench_status_rdzv.py [--runs 9] [--ops 2000]``
(an interpreter that has launcher installed; writes ``benchmarks/results/status_rdzv.json``).
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

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = [sys.executable, "-m", "launcher"]
TICK = os.sysconf("SC_CLK_TCK")
SECRET = "b3e1f0c2d4a6978856a4c2e0f1d3b5a7-bench"
RUN_ID = "bench-status-rdzv"
# Another process (as launcher status is) reading the status back to back until stdin closes;
# it prints how many reads it made.
READER = """
import sys, threading
from launcher.rendezvous.api import RendezvousParameters
from launcher.status.remote import rendezvous_status
params = RendezvousParameters(backend="c10d", endpoint=sys.argv[1], run_id=sys.argv[2], min_nodes=1, max_nodes=1)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
rendezvous_status(params)
print("ready", flush=True)
reads = 0
while not stop.is_set():
    rendezvous_status(params)
    reads += 1
print(reads, flush=True)
"""
WAIT = """
import os, sys, time
end = time.monotonic() + 300
while not os.path.exists(sys.argv[1]) and time.monotonic() < end:
    time.sleep(0.2)
"""


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}
    clean["OMP_NUM_THREADS"] = "1"
    clean["LAUNCHER_RDZV_SECRET"] = SECRET
    return clean


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def get_latencies(endpoint: tuple[str, int], key: str, ops: int) -> list[float]:
    from launcher.store.client import TCPStoreClient

    client = TCPStoreClient(endpoint[0], endpoint[1], timeout=10, secret=SECRET.encode())
    try:
        found = []
        for _ in range(ops):
            t0 = time.perf_counter()
            client.get(key)
            found.append(time.perf_counter() - t0)
        return found
    finally:
        client.close()


def p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--nproc", type=int, default=32, help="ranks per node (2 nodes)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "status_rdzv.json"))
    args = parser.parse_args()
    os.environ["LAUNCHER_RDZV_SECRET"] = SECRET  # the in-process reader proves it too
    from launcher.rendezvous.api import RendezvousParameters
    from launcher.rendezvous.keys import RendezvousKeys
    from launcher.status.remote import rendezvous_status

    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    params = RendezvousParameters(backend="c10d", endpoint=endpoint, run_id=RUN_ID, min_nodes=1, max_nodes=1)
    world = 2 * args.nproc
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "wait.py").write_text(WAIT)
        go = work / "go"
        agents = [subprocess.Popen([*LAUNCHER, "--nnodes", "2", "--nproc-per-node", str(args.nproc), "--rdzv-backend",
                                    "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", RUN_ID, "--local-addr",
                                    "127.0.0.1", "--rdzv-conf", f"is_host={1 - i},join_timeout=120",
                                    str(work / "wait.py"), str(go)], env=env(), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL) for i in (0, 1)]
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                try:
                    doc = rendezvous_status(params)
                    if len(doc["ranks"]) == world and not doc["missing_nodes"]:
                        break
                except Exception:  # not formed yet
                    pass
                time.sleep(0.5)
            else:
                raise SystemExit(f"the {world}-rank job did not publish its status through the rendezvous")
            time.sleep(3)  # every worker up, two publishes made
            walls, inproc = [], []
            flags = ["--rdzv-endpoint", endpoint, "--rdzv-id", RUN_ID, "--json"]
            for _ in range(args.runs):
                t0 = time.perf_counter()
                result = subprocess.run([*LAUNCHER, "status", *flags], env=env(), capture_output=True, text=True)
                walls.append(time.perf_counter() - t0)
                assert result.returncode == 0 and len(json.loads(result.stdout)["ranks"]) == world, result
                t0 = time.perf_counter()
                assert len(rendezvous_status(params)["ranks"]) == world
                inproc.append(time.perf_counter() - t0)

            key = RendezvousKeys(RUN_ID).current
            store = ("127.0.0.1", port)
            host_pid = agents[0].pid
            idle: list[float] = []
            loaded: list[float] = []
            cpu_idle: list[float] = []
            cpu_loaded: list[float] = []
            reads = [0]
            for _ in range(3):  # alternated: idle, then under a reader that never pauses
                before, t0 = cpu_seconds(host_pid), time.monotonic()
                idle += get_latencies(store, key, args.ops)
                cpu_idle.append((cpu_seconds(host_pid) - before) / (time.monotonic() - t0))
                reader = subprocess.Popen([sys.executable, "-c", READER, endpoint, RUN_ID], env=env(),
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
                before, t0 = cpu_seconds(host_pid), time.monotonic()
                loaded += get_latencies(store, key, args.ops)
                cpu_loaded.append((cpu_seconds(host_pid) - before) / (time.monotonic() - t0))
                out, _ = reader.communicate("", timeout=60)
                reads[0] += int(out.split()[-1])
        finally:
            go.touch()
            for agent in agents:
                try:
                    agent.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()
    results = {
        "ranks": world,
        "status_rdzv_command_wall_s": statistics.median(walls),
        "status_rdzv_in_process_s": statistics.median(inproc),
        "store_get_idle_median_s": statistics.median(idle),
        "store_get_idle_p99_s": p99(idle),
        "store_get_reading_median_s": statistics.median(loaded),
        "store_get_reading_p99_s": p99(loaded),
        "status_reads_during_loaded_gets": reads[0],
        "store_host_cpu_idle": statistics.median(cpu_idle),
        "store_host_cpu_reading": statistics.median(cpu_loaded),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "runs": args.runs,
        "ops": args.ops,
    }
    for key, value in results.items():
        print(f"{key:34} {value:.6f}" if isinstance(value, float) else f"{key:34} {value}")
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
