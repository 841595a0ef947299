"""How long a spare takes to replace a lost node: launcher now, launcher before, and torchrun.

Three real agents for ``--nnodes 2`` (``--nproc-per-node 2``, c10d, every setting at its default,
``--max-restarts`` too unless ``--max-restarts N`` is given) in network namespace hosts
(``tests/multinode``: needs root), all started at once, so one of them waits as the spare. Every rank runs
``tests/multinode/scripts/elastic_worker.py`` (gloo all_reduce steps with a checkpoint). Once the
two active nodes have done a few steps, an active node that does not serve the store is lost:

- ``sigkill``: its agent is SIGKILLed (a crash, the OOM killer);
- ``link-cut``: its cable is pulled (its interface goes down: no connection closes).

Measured: seconds from that moment to the spare's first worker process running. torchrun runs
with ``is_host`` set on the first node (it cannot tell a namespace's address is its own).
``--base DIR`` also runs the launcher whose ``core`` is in DIR (``git archive <commit> core | tar
-x -C DIR``), for a before/after figure. Runs go one at a time (the machine is small); each
stops ``--cap`` seconds after its event. Writes ``benchmarks/results/spares.json``.

Usage::

    sudo .tox/py3/bin/python benchmarks/bench_spares.py [--base /tmp/base] [--repeat 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.multinode.harness import ELASTIC, ENDING, AgentProcess, agent_env, free_port, read_progress  # noqa: E402
from tests.multinode.netns import Network  # noqa: E402


def workers(host) -> int:
    """The host's worker processes (the agents, run with ``-m``, name the script too)."""
    count = 0
    for pid in host.pids():
        with contextlib.suppress(OSError):  # gone meanwhile
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            count += b"_worker.py" in argv and b"\0-m\0" not in argv
    return count


def started(state: Path, net, alone: bool) -> bool:
    """The two active nodes are at work: step 5 done (all_reduce), or two hosts' ranks ready."""
    if not alone:
        return any(r["step"] >= 5 for r in read_progress(state))
    return sum(workers(net[i]) == 2 for i in range(3)) == 2 and len(list(state.glob("*"))) >= 4


def run(tool: str, scenario: str, cap: float, base: str | None, out: Path, restarts: int | None,
        alone: bool = False) -> dict:
    """One job: seconds from losing an active node to the spare's workers running."""
    logs = out / f"{tool}-{scenario}"
    logs.mkdir(parents=True)
    state = logs / "state"
    state.mkdir()
    with Network(3) as net:
        port = free_port(net[0])
        # ``alone``: ranks that stop using collectives once the group formed (ending_worker.py), so
        # that no survivor's worker fails with the lost node: only the rendezvous notices it.
        env: dict[str, str] = {"MN_RUN": "*:600", "MN_FAIL_AFTER_EXITS": str(state)} if alone else {}
        program = ("-m", "torch.distributed.run") if tool == "torchrun" else ("-m", "launcher")
        if tool == "launcher-before" and base:
            env["PYTHONPATH"] = f"{base}/core:{ROOT}"
        agents = []
        for i in range(3):
            args = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", net[0].endpoint(port), "--rdzv-id", f"{tool}-{scenario}",
                    "--local-addr", net[i].addr, *([ENDING] if alone else [ELASTIC, str(state), "100000", "0.1"])]
            if restarts is not None:
                args[10:10] = ["--max-restarts", str(restarts)]
            if tool == "torchrun" and i == 0:
                args[10:10] = ["--rdzv-conf", "is_host=true"]
            agents.append(AgentProcess(net[i], f"node{i}", args, logs, agent_env(net[i], env), program))
        deadline = time.monotonic() + cap
        # Two active nodes at step 5: the spare is the host without workers.
        while time.monotonic() < deadline and not started(state, net, alone):
            time.sleep(0.1)
        counts = [workers(net[i]) for i in range(3)]
        active = [i for i in range(3) if counts[i]]
        idle = [i for i in range(3) if not counts[i]]
        if len(active) != 2 or len(idle) != 1:
            for agent in agents:
                agent.host.kill_all()
            return {"error": f"no spare: workers per node {counts}", "logs": str(logs)}
        spare = idle[0]
        victim = max(active)  # not node 0 (it serves the store) unless node 0 is the spare
        event = time.monotonic()
        if scenario == "sigkill":
            agents[victim].kill(signal.SIGKILL)
        else:
            net[victim].cut()
        replaced = None
        deadline = event + cap
        survivor = next(i for i in active if i != victim)
        ended = None
        while time.monotonic() < deadline:
            if workers(net[spare]):
                replaced = time.monotonic() - event
                break
            ended = agents[survivor].poll()
            if ended is not None:  # the job ended instead of taking the spare
                break
            time.sleep(0.02)
        for agent in agents:
            agent.host.kill_all()
            with contextlib.suppress(OSError):
                agent.kill()
        if replaced is None:
            why = f"the job failed: survivor exited {ended}" if ended is not None else f"not within {cap:g} s"
            return {"seconds": None, "note": why, "logs": str(logs)}
        return {"seconds": round(replaced, 2), "victim": victim, "spare": spare}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=120.0, help="seconds after the event before giving up")
    parser.add_argument("--base", help="a directory with an older launcher's core/ (before/after)")
    parser.add_argument("--tools", default="launcher,torchrun", help="comma list of launcher, torchrun")
    parser.add_argument("--scenarios", default="sigkill,link-cut", help="comma list")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each tool and scenario")
    parser.add_argument("--workers", choices=("allreduce", "alone"), default="allreduce",
                        help="allreduce: ranks keep all-reducing (a survivor's workers fail with the lost node); "
                        "alone: ranks stop using collectives once formed (only the rendezvous notices)")
    parser.add_argument("--max-restarts", type=int, default=None,
                        help="pass --max-restarts N to every agent (default: not given, i.e. 0)")
    options = parser.parse_args()
    tools = options.tools.split(",") + (["launcher-before"] if options.base else [])
    out = Path(tempfile.mkdtemp(prefix="bench_spares_"))
    results: dict[str, dict] = {}
    for scenario in options.scenarios.split(","):
        for tool in tools:
            runs = [run(tool, scenario, options.cap, options.base, out / str(k), options.max_restarts,
                        options.workers == "alone") for k in range(options.repeat)]
            seconds = [r["seconds"] for r in runs if r.get("seconds") is not None]
            results[f"{tool} {scenario}"] = {
                "median_s": round(statistics.median(seconds), 2) if seconds else None,
                "runs": runs,
            }
            print(f"{tool:16} {scenario:9} {json.dumps(results[f'{tool} {scenario}'])}", flush=True)
    target = ROOT / "benchmarks" / "results" / "spares.json"
    # One entry per --max-restarts setting; the other setting's latest run is kept.
    kept = json.loads(target.read_text()) if target.exists() else {}
    kept.pop("cap_s", None)
    kept.pop("results", None)
    restarts = options.max_restarts if options.max_restarts is not None else "default"
    kept[f"workers={options.workers} max_restarts={restarts}"] = results
    target.write_text(json.dumps({"cap_s": options.cap, **kept}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
