"""The agent's side: a sick node's record in a real rendezvous store, read by a healthy node."""

from __future__ import annotations

import pytest
from launcher.agent.group import Entrypoint
from launcher.agent.result import AgentResult
from launcher.config import LaunchConfig
from launcher.failures.report import FailureReport, ReportedFailure, WorkerFailure
from launcher.health.api import EXIT_NODE_SICK
from launcher.health.gate import HealthGate, NodeSick
from launcher.health.settings import health_settings
from launcher.plan import build_plan
from launcher.plugins.manager import get_plugin_manager
from launcher.rendezvous.api import RendezvousParameters
from launcher.rendezvous.dynamic import handler_over_store
from launcher.store.client import TCPStoreClient

REASON = "nvidia-smi: GPU 5 has fallen off the bus"


def _plan(tmp_path, checks=None, command=None):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, run_id="gate-test",
                          settings={"health": health_settings(checks, command)})
    return build_plan(config, get_plugin_manager(autoload=False), Entrypoint(command=["python", "-u", str(script)]))


def _handler(server):
    host, port = server.address.rsplit(":", 1)
    params = RendezvousParameters("c10d", server.address, "gate-test", 1, 2)
    return handler_over_store(TCPStoreClient(host, int(port), timeout=10), params)


@pytest.fixture
def check_cmd(tmp_path):
    path = tmp_path / "check.sh"
    path.write_text(f"#!/bin/sh\necho '{REASON}'\nexit 1\n")
    path.chmod(0o755)
    return str(path)


def test_sick_node_posts_and_healthy_node_names_it_once(tmp_path, check_cmd, launcher_store_server):
    sick_events, ok_events = [], []
    sick_gate = HealthGate(_plan(tmp_path, command=check_cmd), lambda t, **d: sick_events.append((t, d)))
    ok_gate = HealthGate(_plan(tmp_path, checks="disk"), lambda t, **d: ok_events.append((t, d)))
    sick_handler, ok_handler = _handler(launcher_store_server), _handler(launcher_store_server)
    try:
        assert ok_gate.poll(ok_handler) == []
        ok_gate.before_join(ok_handler)  # healthy: returns
        with pytest.raises(NodeSick) as raised:
            sick_gate.before_join(sick_handler)
        assert raised.value.exit_code == EXIT_NODE_SICK
        assert raised.value.check == "command" and REASON in raised.value.reason
        assert sick_gate.excluded is raised.value
        assert [t for t, _ in sick_events] == ["node_excluded"]

        (record,) = ok_gate.poll(ok_handler)
        assert record.check == "command" and REASON in record.reason
        assert ok_gate.poll(ok_handler) == []  # named once
        assert [(t, d["check"]) for t, d in ok_events] == [("node_excluded", "command")]

        failure = ReportedFailure(WorkerFailure("vm", 0, 0, "default", 4242, 1, None, 1.0e9))
        result = AgentResult(exit_code=1, report=FailureReport(failures=[failure]))
        ok_gate.finish(ok_handler, result)
        assert result.report is not None
        assert len(result.report.notes) == 1 and REASON in result.report.notes[0]
        assert REASON in result.report.render()
        assert "1 node(s) were kept out of this job by health checks" in result.report.notes[0]
        assert len(ok_events) == 1  # finish names it again in the report, not as a second event
    finally:
        sick_handler.shutdown()
        ok_handler.shutdown()


def test_no_checks_means_nothing_runs(tmp_path, check_cmd, launcher_store_server):
    gate = HealthGate(_plan(tmp_path, checks="none"), lambda t, **d: None)
    handler = _handler(launcher_store_server)
    try:
        gate.before_join(handler)
        assert gate.last_outcomes == []
    finally:
        handler.shutdown()


def _waiting_check(tmp_path):
    """A --health-check-cmd that writes its pid, then waits for the file ``go`` and fails."""
    go, pid = tmp_path / "go", tmp_path / "check.pid"
    path = tmp_path / "waiting-check.sh"
    path.write_text(f"#!/bin/sh\necho $$ > {pid}.tmp\nmv {pid}.tmp {pid}\n"
                    f"while [ ! -e {go} ]; do sleep 0.01; done\necho '{REASON}'\nexit 1\n")
    path.chmod(0o755)
    return str(path), go, pid


def _wait_for(path, seconds=30.0):
    import time

    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.exists(), f"{path} never appeared"


def test_checks_run_beside_and_the_verdict_waits_for_them(tmp_path, launcher_store_server):
    """start() returns while a check runs; verdict() waits for its answer, and a sick one still
    raises and leaves its record before the node could join."""
    command, go, pid = _waiting_check(tmp_path)
    events = []
    gate = HealthGate(_plan(tmp_path, command=command), lambda t, **d: events.append(t))
    handler = _handler(launcher_store_server)
    try:
        gate.start()
        _wait_for(pid)  # the check runs, and start() has returned: the agent goes on meanwhile
        assert gate.last_outcomes == [] and events == []
        go.touch()
        with pytest.raises(NodeSick, match="nvidia-smi: GPU 5"):
            gate.verdict(handler)
        assert events == ["node_excluded"]
        assert [o.name for o in gate.last_outcomes if o.result.is_sick] == ["command"]
    finally:
        handler.shutdown()


def test_close_kills_the_processes_of_checks_not_waited_for(tmp_path):
    import os
    import signal
    import time

    command, go, pid = _waiting_check(tmp_path)
    gate = HealthGate(_plan(tmp_path, command=command), lambda t, **d: None)
    gate.start()
    _wait_for(pid)
    check_pid = int(pid.read_text())
    try:
        gate.close()  # the agent ends before the verdict (its rendezvous failed, say)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(check_pid):
            time.sleep(0.01)
        assert not _alive(check_pid), "the check's process outlived the gate"
    finally:
        if _alive(check_pid):
            os.kill(check_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
