"""A preemption signal that arrives while the agent asks the rendezvous whether its membership
changed (a store round trip, seconds when the store is slow) is a preemption of running workers:
they are told and get the grace. (A CI run once found a node that said "preempted while no worker
ran" and stopped its workers at once: the signal had ended that check's wait.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import launcher_env
from tests.preemption.test_notice import WORKER

# The agent of a real one-node job, in a process of its own (its signal handlers and cgroup are
# its own), with the job's real handler wrapped: the first membership check after every rank is
# ready sends this process SIGTERM from inside the check, and then waits there (the handler's
# SignalReceived ends the wait), so the signal comes inside the check every time, not by luck.
AGENT = """
import os, signal, sys, time
from pathlib import Path

from launcher.agent.agent import Agent
from launcher.command_line import read_command_line
from launcher.options import flag_groups, parse_args
from launcher.plugins.manager import get_plugin_manager

state = Path(sys.argv[1])
manager = get_plugin_manager()
groups = flag_groups(manager)
args = parse_args(["--standalone", "--nproc-per-node", "2", "--preemption-grace", "60", sys.argv[2], str(state)],
                  groups)
plan = read_command_line(args, manager, groups=groups).plan(manager)


class SignalInsideTheCheck:
    def __init__(self, handler):
        self._handler = handler

    def __getattr__(self, name):
        return getattr(self._handler, name)

    def num_nodes_waiting(self):
        if len(list(state.glob("ready-*"))) == 2 and not (state / "signalled").exists():
            (state / "signalled").touch()
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)  # ended by the agent's handler (SignalReceived), not waited out
        return self._handler.num_nodes_waiting()


result = Agent(plan, handler=SignalInsideTheCheck(plan.rendezvous.create_handler())).run()
print(result.exit_code, result.preempted, result.message, file=sys.stderr)
sys.exit(result.exit_code)
"""


def test_sigterm_during_the_membership_check_preempts_the_running_workers(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "agent.py").write_text(AGENT)
    done = subprocess.run([sys.executable, str(tmp_path / "agent.py"), str(state), str(tmp_path / "worker.py")],
                          env=launcher_env(), capture_output=True, text=True, timeout=120)
    assert (state / "signalled").exists(), done.stderr  # the signal came inside the check
    assert done.returncode == 75, done.stderr
    for rank in (0, 1):
        saved = json.loads((state / f"saved-{rank}").read_text())
        assert saved["preempted"] and 0 < saved["left"] <= 60, (saved, done.stderr)
    assert "2 of 2 local worker(s) exited cleanly within the 60 s grace" in done.stderr, done.stderr
    assert "while no worker ran" not in done.stderr, done.stderr
