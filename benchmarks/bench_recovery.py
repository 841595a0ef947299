"""How long a job takes to get back to work after a failure: recovery in place, full restart, torchrun.

Two agents for ``--nnodes 2`` (``--nproc-per-node 2``, c10d, ``--max-restarts 2``) in network namespace
hosts (``tests/multinode``: needs root). Every rank runs ``examples/recoverable_train.py`` (imports torch,
gloo all-reduce steps of ``TOY_STEP_SLEEP`` seconds, an in-memory checkpoint per step, the training function
under ``launcher.recoverable``). At step 10 of the first attempt, global rank 3 (on the second node) fails:

- ``raise``: its training function raises;
- ``kill``: the process SIGKILLs itself.

Measured: seconds from the failure (the rank's own timestamp, just before it raises or dies) until every
rank has finished the first all-reduce of the next attempt (each rank's timestamp; the hosts share a clock).

- ``in-place``: launcher, as is (live workers keep their process; a dead one is replaced);
- ``in-place-preload``: the same with ``--preload torch`` (a replacement is forked from a template);
- ``restart``: launcher with ``--recovery restart`` (every worker stopped and started again);
- ``torchrun``: ``python -m torch.distributed.run`` (``is_host`` set on the first node; the wrapper is a
  pass-through there).

Runs go one at a time (the machine is small); each gives up ``--cap`` seconds after the failure.
Writes ``benchmarks/results/recovery.json``.

Usage::

    sudo .tox/py3/bin/python benchmarks/bench_recovery.py [--repeat 3] [--tools in-place,restart,torchrun]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.multinode.harness import AgentProcess, agent_env, free_port  # noqa: E402
from tests.multinode.netns import Network  # noqa: E402

EXAMPLE = str(ROOT / "examples" / "recoverable_train.py")
FAIL_RANK, FAIL_STEP = 3, 10


def records(out: Path) -> list[dict]:
    found = []
    for path in out.glob("rank*.jsonl"):
        with contextlib.suppress(OSError, ValueError):
            found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def back_at_work(out: Path) -> float | None:
    """Seconds from the failure until every rank finished its first collective after it (``None``: not yet)."""
    rows = records(out)
    failed = [r["t"] for r in rows if r["event"] == "failing"]
    if not failed:
        return None
    after = {}
    for row in rows:
        if row["event"] == "first_collective" and row["t"] > failed[0]:
            after.setdefault(row["pid"], row["t"])
    return max(after.values()) - failed[0] if len(after) >= 4 else None


def run(tool: str, scenario: str, cap: float, out: Path, step_sleep: float) -> dict:
    out.mkdir(parents=True)
    with Network(2) as net:
        port = free_port(net[0])
        env = {"TOY_OUT": str(out), "TOY_STEPS": "100000", "TOY_STEP_SLEEP": str(step_sleep),
               "TOY_FAIL": f"{FAIL_RANK}:{FAIL_STEP}:{scenario}"}
        program = ("-m", "torch.distributed.run") if tool == "torchrun" else ("-m", "launcher")
        agents = []
        for i in range(2):
            args = ["--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "2", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", net[0].endpoint(port), "--rdzv-id", f"{tool}-{scenario}",
                    "--local-addr", net[i].addr]
            if tool == "restart":
                args += ["--recovery", "restart"]
            if tool == "in-place-preload":  # a replacement is forked from a template that has torch
                args += ["--preload", "torch"]
            if tool == "torchrun" and i == 0:
                args += ["--rdzv-conf", "is_host=true"]
            agents.append(AgentProcess(net[i], f"node{i}", [*args, EXAMPLE], out, agent_env(net[i], env), program))
        deadline = time.monotonic() + cap + 120  # start-up, then the failure at step 10
        seconds = None
        failed_at = None
        while time.monotonic() < deadline:
            seconds = back_at_work(out)
            if seconds is not None:
                break
            if failed_at is None and any(r["event"] == "failing" for r in records(out)):
                failed_at = time.monotonic()
                deadline = failed_at + cap
            if all(agent.poll() is not None for agent in agents):
                break
            time.sleep(0.1)
        for agent in agents:
            agent.host.kill_all()
            with contextlib.suppress(OSError):
                agent.kill()
    if seconds is None:
        return {"seconds": None, "note": f"not back at work within {cap:g} s of the failure", "logs": str(out)}
    return {"seconds": round(seconds, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=60.0, help="seconds after the failure before giving up")
    parser.add_argument("--tools", default="in-place,restart,torchrun", help="comma list")
    parser.add_argument("--scenarios", default="raise,kill", help="comma list")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each tool and scenario")
    parser.add_argument("--step-sleep", type=float, default=0.05, help="seconds each training step sleeps")
    options = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench_recovery_"))
    results: dict[str, dict] = {}
    for scenario in options.scenarios.split(","):
        for tool in options.tools.split(","):
            runs = [run(tool, scenario, options.cap, out / f"{tool}-{scenario}-{k}", options.step_sleep)
                    for k in range(options.repeat)]
            seconds = [r["seconds"] for r in runs if r.get("seconds") is not None]
            results[f"{tool} {scenario}"] = {
                "median_s": round(statistics.median(seconds), 3) if seconds else None,
                "runs": runs,
            }
            print(f"{tool:9} {scenario:6} {json.dumps(results[f'{tool} {scenario}'])}", flush=True)
    target = ROOT / "benchmarks" / "results" / "recovery.json"
    target.write_text(json.dumps({"cap_s": options.cap, "fail": f"rank {FAIL_RANK} at step {FAIL_STEP}",
                                  "results": results}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
