"""What ``launcher status`` and ``--metrics-port`` cost a job.

- ``startup``: ``--standalone --nproc-per-node 4`` with a no-op worker, from invoking the command
  to the last worker's first line (the workers write their own clock), without and with
  ``--metrics-port 0``, alternating run by run; medians of ``--runs``.
- ``status``: a 64-rank job (``--nproc-per-node 64``, workers that wait), then ``launcher status
  LOGDIR`` run ``--runs`` times: its wall time as a command (interpreter start and the 0.25 s CPU
  sample included), and in-process the time to find, read and merge the status without the CPU
  sample; plus the agent's own CPU over a 10 s window while its 64 ranks run (an upper bound of
  what publishing every 2 s costs: the agent's watching is in it too), and one scrape of
  ``/metrics``.

Usage: ``.tox/py3/bin/python benchmarks/bench_status.py [--runs 9] [--json benchmarks/results/status.json]``
(an interpreter that has launcher installed).
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
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = [sys.executable, "-m", "launcher"]
TICK = os.sysconf("SC_CLK_TCK")

NOOP = """
import time
t = time.time()
import os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    f.write(repr(t))
"""
WAIT = """
import os, sys, time
end = time.monotonic() + 120
while not os.path.exists(sys.argv[1]) and time.monotonic() < end:
    time.sleep(0.2)
"""


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}
    clean["OMP_NUM_THREADS"] = "1"
    return clean


def startup(work: Path, flags: list[str]) -> float:
    out = Path(tempfile.mkdtemp(dir=work))
    script = work / "noop.py"
    started = time.time()
    subprocess.run([*LAUNCHER, "--standalone", "--nproc-per-node", "4", *flags, str(script), str(out)], env=env(),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return max(float((out / str(rank)).read_text()) for rank in range(4)) - started


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_cost(work: Path, runs: int, nproc: int) -> dict[str, float]:
    from launcher.status.report import job_status

    go, logs = work / "go", work / "logs"
    job = subprocess.Popen([*LAUNCHER, "--standalone", "--nproc-per-node", str(nproc), "--log-dir", str(logs),
                            "--metrics-port", "0", str(work / "wait.py"), str(go)], env=env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = list(logs.glob("*/status.json"))
            if found and len(json.loads(found[0].read_text())["ranks"]) == nproc:
                break
            time.sleep(0.2)
        else:
            raise SystemExit("the 64-rank job did not publish its status")
        time.sleep(3)  # every worker up, two publishes made
        record = json.loads(found[0].read_text())
        before, started = cpu_seconds(job.pid), time.monotonic()
        time.sleep(10)
        agent_cpu = (cpu_seconds(job.pid) - before) / (time.monotonic() - started)
        walls, inproc = [], []
        for _ in range(runs):
            t0 = time.perf_counter()
            result = subprocess.run([*LAUNCHER, "status", str(logs)], env=env(), capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            assert result.returncode == 0 and len(result.stdout.splitlines()) == nproc + 2, result
            t0 = time.perf_counter()
            doc = job_status(str(logs), cpu_sample=0.0)
            inproc.append(time.perf_counter() - t0)
            assert len(doc["ranks"]) == nproc
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{record['metrics_port']}/metrics", timeout=10) as response:
            body = response.read()
        scrape = time.perf_counter() - t0
    finally:
        go.touch()
        job.wait(timeout=120)
    return {
        "status_command_wall_s": statistics.median(walls),
        "status_in_process_s": statistics.median(inproc),
        "agent_cpu_fraction_64_ranks": agent_cpu,
        "metrics_scrape_s": scrape,
        "metrics_bytes": len(body),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--nproc", type=int, default=64)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "status.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "noop.py").write_text(NOOP)
        (work / "wait.py").write_text(WAIT)
        plain, metrics = [], []
        for _ in range(args.runs):  # alternating, so load changes hit both alike
            plain.append(startup(work, []))
            metrics.append(startup(work, ["--metrics-port", "0"]))
        results = {
            "startup_s": statistics.median(plain),
            "startup_metrics_port_s": statistics.median(metrics),
            **status_cost(work, args.runs, args.nproc),
        }
    results["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    results["runs"] = args.runs
    for key, value in results.items():
        print(f"{key:32} {value:.4f}" if isinstance(value, float) else f"{key:32} {value}")
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
