"""How fast SIGTERM stops a 2-node c10d job in each phase (issue 41): launcher against torchrun.

Two real agents (``--nproc-per-node 1``, c10d) in network namespace hosts (``tests/multinode``:
needs root); node 0's address is the endpoint. The workers run
``tests/multinode/scripts/ending_worker.py`` (a gloo group, then a sleep). One agent gets SIGTERM
in each phase:

- ``port-taken``: node 0 alone, the endpoint's port on its own machine held by a socket that
  never listens (not a store): how long it waits by itself; SIGTERM after 10 s if it still waits.
- ``store-wait``: node 1 alone, before anything serves the endpoint (a node started before the
  host, as Slurm and Kubernetes often order them).
- ``join-wait``: ``--nnodes 3``; both nodes joined, the third never comes; node 1 is signalled.
- ``workers``: both nodes' workers run; node 1 is signalled.
- ``host-at-barrier``: node 0's worker has finished (its agent waits at the exit barrier), node
  1's runs on; node 0, the store's host, is signalled.

Measured from the signal to each agent's exit ("still running" after ``--cap`` seconds). The
phases are reached by events (a line, the workers' state), or, for torchrun, which says less,
after ``--settle`` seconds. Runs one job at a time, launcher then torchrun for each phase.
Writes ``benchmarks/results/stopping.json`` with the machine's load.

Usage::

    sudo .tox/py3/bin/python benchmarks/bench_stopping.py [--cap 30] [--phases workers,host-at-barrier]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_endings import workers_left  # noqa: E402
from tests.multinode.harness import ENDING, AgentProcess, agent_env, free_port  # noqa: E402
from tests.multinode.netns import Network  # noqa: E402

PHASES = ("port-taken", "store-wait", "join-wait", "workers", "host-at-barrier")
CONF = "join_timeout=600,read_timeout=5,keep_alive_interval=0.5,heartbeat_timeout=3"


def _reached(tool: str, phase: str, agents: list[AgentProcess], net: Network, started: float, settle: float) -> bool:
    """Whether the phase to signal in has been reached."""
    said = [a.stderr + a.stdout for a in agents]
    if phase == "port-taken":
        return True  # measured from the start: the agent should end by itself
    if phase == "store-wait":
        return "waiting for the store" in said[0] if tool == "launcher" else time.monotonic() - started > settle
    if phase == "join-wait":
        if tool == "launcher":
            return all("joined round 0 as number" in text for text in said)
        return time.monotonic() - started > settle
    ready = "rank 0 ready" in said[0] and "rank 1 ready" in said[-1]
    if phase == "workers":
        return ready
    return ready and workers_left(net[0]) == 0  # host-at-barrier: node 0's worker has exited


def run(tool: str, phase: str, cap: float, settle: float, out: Path) -> dict:
    logs = out / f"{tool}-{phase}"
    logs.mkdir(parents=True)
    with Network(2) as net:
        port = free_port(net[0])
        env = agent_env(net[0], {"MN_RUN": "0:0,*:600" if phase == "host-at-barrier" else "*:600"})
        program = ("-m", "torch.distributed.run") if tool == "torchrun" else ("-m", "launcher")
        nodes = {"port-taken": (0,), "store-wait": (1,)}.get(phase, (0, 1))
        holder = None
        if phase == "port-taken":  # bound, never listening: the port is taken, and nobody ever answers
            holder = net[0].popen([sys.executable, "-c", "import socket, time; s = socket.socket(); "
                                   f"s.bind(('', {port})); print('bound', flush=True); time.sleep(600)"],
                                  stdout=subprocess.PIPE)
            assert holder.stdout is not None and holder.stdout.readline().startswith(b"bound")
        agents = []
        for i in nodes:
            conf = f"is_host={'true' if i == 0 else 'false'}" if tool == "torchrun" else CONF
            if tool == "torchrun":
                conf += ",join_timeout=600"
            args = ["--nnodes", "3" if phase == "join-wait" else "2", "--nproc-per-node", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", net[0].endpoint(port), "--rdzv-id", f"{tool}-{phase}",
                    "--rdzv-conf", conf, "--local-addr", net[i].addr, "--monitor-interval", "0.2", ENDING]  # fmt: skip
            agents.append(AgentProcess(net[i], f"node{i}", args, logs, agent_env(net[i], dict(env)), program))
        started = time.monotonic()
        while not _reached(tool, phase, agents, net, started, settle):
            if any(a.poll() is not None for a in agents) or time.monotonic() - started > 180:
                return {"error": "the phase was not reached", "logs": str(logs)}
            time.sleep(0.05)
        if phase == "host-at-barrier":
            time.sleep(1.0)  # node 0's agent is at its exit barrier
        victim = agents[0] if phase == "host-at-barrier" else agents[-1]
        event = time.monotonic()
        if phase == "port-taken":
            event = victim.started
            while victim.poll() is None and time.monotonic() < event + 10:
                time.sleep(0.02)
        if victim.poll() is None:
            victim.kill(signal.SIGTERM)
            event = time.monotonic()
        while time.monotonic() < event + cap and None in [a.poll() for a in agents]:  # poll() notes each end
            time.sleep(0.02)
        result = {}
        for agent in agents:
            code = agent.poll()
            role = "signalled" if agent is victim else "other"
            if code is None:
                result[role] = {"exit": None, "seconds": f"still running after {cap:g} s"}
                agent.host.kill_all()
                agent.kill()
            else:
                result[role] = {"exit": code, "seconds": round((agent.ended or event) - event, 2)}
                if phase == "port-taken" and event == agent.started:
                    result[role]["by_itself"] = [line for line in agent.stderr.splitlines() if "port" in line][-1:]
        if holder is not None:
            holder.kill()
            holder.wait()
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=30.0, help="seconds before an agent counts as still running")
    parser.add_argument("--settle", type=float, default=12.0,
                        help="seconds torchrun is given to reach a phase it does not announce")
    parser.add_argument("--tools", default="launcher,torchrun", help="comma list of launcher, torchrun")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma list")
    options = parser.parse_args()
    results: dict[str, dict] = {}
    out = Path(tempfile.mkdtemp(prefix="bench_stopping_"))
    load_before = os.getloadavg()[0]
    for phase in options.phases.split(","):
        for tool in options.tools.split(","):
            results[f"{tool} {phase}"] = run(tool, phase, options.cap, options.settle, out)
            print(f"{tool:9} {phase:16} {json.dumps(results[f'{tool} {phase}'])}", flush=True)
    target = ROOT / "benchmarks" / "results" / "stopping.json"
    target.write_text(json.dumps({"cap_s": options.cap, "signal": "SIGTERM", "cpus": os.cpu_count(),
                                  "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                                  "results": results}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
