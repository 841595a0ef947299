"""How long a 2-node job takes to end once a node has finished: launcher against torchrun.

Two real agents (``--nnodes 2 --nproc-per-node 2``, c10d, ``--max-restarts 3``) in network
namespace hosts (``tests/multinode``: needs root), each rank running
``tests/multinode/scripts/ending_worker.py``:

- ``failure-after-finish`` (issue 33): node 0's ranks finish at once, rank 3 on node 1 exits 7
  once they have exited and a second more has passed. Measured from rank 3's exit to each
  agent's exit.
- ``lost-at-barrier`` (issue 25): node 0's ranks finish at once, node 1's run on; once node 0's
  workers are gone (it waits at its exit barrier), node 1's agent is SIGKILLed. Measured from
  the kill to node 0's exit.

launcher runs with ``heartbeat_timeout=3`` (``keep_alive_interval=0.5``); torchrun with its
defaults (``is_host`` set: it cannot tell a namespace's address is its own). ``--base DIR``
also runs the launcher whose ``core`` is in DIR (``git archive <commit> core | tar -x -C DIR``),
for a before/after figure. Each run stops ``--cap`` seconds after its event ("still running"); all tools run at
once, each in its own pair of hosts. Writes ``benchmarks/results/endings.json``.

Usage::

    sudo .tox/py3/bin/python benchmarks/bench_endings.py --cap 400 [--base /tmp/base]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.multinode.harness import ENDING, AgentProcess, agent_env, free_port  # noqa: E402
from tests.multinode.netns import Network  # noqa: E402

CONF = "read_timeout=5,keep_alive_interval=0.5,heartbeat_timeout=3"


def workers_left(host) -> int:
    """The host's workers still running (the agents, run with ``-m``, name the script too)."""
    count = 0
    for pid in host.pids():
        with contextlib.suppress(OSError):  # gone meanwhile
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            count += b"ending_worker" in argv and b"\0-m\0" not in argv
    return count


def run(tool: str, scenario: str, cap: float, base: str | None, out: Path) -> dict:
    """One job; each agent's exit status and seconds from the event to its exit."""
    logs = out / f"{tool}-{scenario}"
    logs.mkdir(parents=True)
    with Network(2) as net:
        port = free_port(net[0])
        env = {"MN_RUN": "0:0,1:0,*:600"}
        mark = logs / "failed_at"
        if scenario == "failure-after-finish":
            # Rank 3 fails once node 0's ranks have exited (and a second more has passed).
            (logs / "pids").mkdir()
            env.update({"MN_RUN": "0:0,1:0,3:0,*:600", "MN_FAIL_RANK": "3", "MN_FAIL_CODE": "7",
                        "MN_FAIL_MARK": str(mark), "MN_FAIL_AFTER_EXITS": str(logs / "pids"), "MN_FINISHERS": "0,1"})
        program = ("-m", "torch.distributed.run") if tool == "torchrun" else ("-m", "launcher")
        if tool == "launcher-base" and base:
            env["PYTHONPATH"] = f"{base}/core:{ROOT}"
        agents = []
        for i in (0, 1):
            conf = f"is_host={'true' if i == 0 else 'false'}" if tool == "torchrun" else CONF
            args = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", net[0].endpoint(port), "--rdzv-id", f"{tool}-{scenario}",
                    "--rdzv-conf", conf, "--local-addr", net[i].addr, "--monitor-interval", "0.2",
                    "--max-restarts", "3", ENDING]  # fmt: skip
            agents.append(AgentProcess(net[i], f"node{i}", args, logs, agent_env(net[i], env), program))
        event = None
        deadline = time.monotonic() + cap
        while time.monotonic() < deadline and any(a.poll() is None for a in agents):
            if event is None and scenario == "failure-after-finish" and mark.exists() and mark.read_text():
                event = time.monotonic() - (time.time() - float(mark.read_text()))
                deadline = event + cap  # the cap counts from the event
            if event is None and scenario == "lost-at-barrier" and "rank 1 ready" in agents[0].stdout \
                    and workers_left(net[0]) == 0:
                time.sleep(1.0)  # node 0's agent is at its exit barrier
                agents[1].kill(signal.SIGKILL)
                event = time.monotonic()
                deadline = event + cap
            time.sleep(0.05)
        result = {}
        for agent in agents:
            code = agent.poll()
            if code is None:
                result[agent.name] = {"exit": None, "seconds": f"still running after {cap:g} s"}
                agent.host.kill_all()
                agent.kill()
            else:
                result[agent.name] = {"exit": code, "seconds": round((agent.ended or 0) - (event or agent.started), 1)}
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=400.0, help="seconds before a run counts as still running")
    parser.add_argument("--base", help="a directory with an older launcher's core/ (before/after)")
    parser.add_argument("--tools", default="launcher,torchrun", help="comma list of launcher, torchrun")
    parser.add_argument("--scenarios", default="failure-after-finish,lost-at-barrier", help="comma list")
    options = parser.parse_args()
    tools = options.tools.split(",") + (["launcher-base"] if options.base else [])
    results: dict[str, dict] = {}
    out = Path(tempfile.mkdtemp(prefix="bench_endings_"))
    threads = []
    for tool in tools:
        for scenario in options.scenarios.split(","):
            def job(tool: str = tool, scenario: str = scenario) -> None:
                results[f"{tool} {scenario}"] = run(tool, scenario, options.cap, options.base, out)
                print(f"{tool:14} {scenario:22} {json.dumps(results[f'{tool} {scenario}'])}", flush=True)
            threads.append(threading.Thread(target=job))
            threads[-1].start()
            time.sleep(3.0)  # stagger the start-ups on a small machine
    for thread in threads:
        thread.join()
    target = ROOT / "benchmarks" / "results" / "endings.json"
    # Results of earlier runs for the other tools are kept: each tool's latest run.
    kept = json.loads(target.read_text()).get("results", {}) if target.exists() else {}
    kept.update(results)
    target.write_text(json.dumps({"cap_s": options.cap, "results": kept}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
