"""The launch plan (launcher.plan): built once, before anything starts; the agent only runs it."""

from __future__ import annotations

import ast
import dataclasses
import logging
import os
import signal
import time
from pathlib import Path

import pytest
from launcher.agent.agent import Agent
from launcher.agent.group import Entrypoint
from launcher.agent.result import WatchOutcome
from launcher.agent.signals import SignalForwarder, SignalReceived
from launcher.config import LaunchConfig
from launcher.errors import UsageError
from launcher.plan import LaunchPlan, build_plan, format_cpus
from launcher.rendezvous.api import RendezvousError

CORE = Path(__file__).resolve().parents[2] / "core"
ENTRY = Entrypoint(command=["true"])


def test_the_plan_is_frozen_and_resolves_every_plugin(plugin_manager, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    config = LaunchConfig(nproc_per_node=2, event_log_handlers=["console", "null"], worker_env={"A": "1"})
    plan = build_plan(config, plugin_manager, ENTRY)
    assert isinstance(plan, LaunchPlan)
    assert plan.rendezvous.backend.name == "c10d"
    assert plan.rendezvous.parameters.run_id == config.run_id
    assert [h.name for h in plan.events.handlers] == ["console", "null"]
    assert plan.logs_specs is not None and plan.hangs is None and plan.workers.cpus is None
    assert plan.workers.base_env["OMP_NUM_THREADS"] == "4"
    assert dict(plan.workers.extra_env) == {"A": "1"}
    assert plan.signals == tuple(int(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.max_restarts = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.workers.base_env["X"] = "1"  # type: ignore[index]
    # Later changes to the config do not reach a plan already built.
    config.worker_env["B"] = "2"
    assert "B" not in plan.workers.extra_env


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"event_log_handlers": ["nope"]}, "unknown event handler 'nope'"),
        ({"logs_specs": "nope"}, "unknown logs specs 'nope'"),
        ({"numa_binding": "nope"}, "unknown numa strategy 'nope'"),
        ({"rdzv_backend": "nope"}, "unknown rendezvous backend 'nope'"),
        ({"rdzv_configs": {"bogus_key": "1"}}, "bogus_key"),
    ],
)
def test_every_unknown_name_is_a_usage_error_while_planning(plugin_manager, change, message):
    config = LaunchConfig(**change)
    with pytest.raises(UsageError, match=message):
        build_plan(config, plugin_manager, ENTRY)


def test_values_changed_after_construction_are_checked_again(plugin_manager):
    config = LaunchConfig()
    config.max_restarts = -1
    with pytest.raises(UsageError, match="--max-restarts"):
        build_plan(config, plugin_manager, ENTRY)


def test_a_log_dir_that_is_a_file_is_a_usage_error(plugin_manager, tmp_path):
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(UsageError, match="is a file"):
        build_plan(LaunchConfig(log_dir=str(path)), plugin_manager, ENTRY)


def test_virtual_local_rank_without_enough_devices_fails_before_anything_starts(plugin_manager, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    config = LaunchConfig(nproc_per_node=2, virtual_local_rank=True)
    with pytest.raises(UsageError, match="local rank 1 has no device of its own"):
        build_plan(config, plugin_manager, ENTRY)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    plan = build_plan(config, plugin_manager, ENTRY)
    assert [dict(env) for env in plan.workers.device_env] == [
        {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "5"},
        {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "7"},
    ]


def test_the_omp_notice_comes_from_the_plan(plugin_manager, monkeypatch, caplog):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with caplog.at_level(logging.WARNING, logger="launcher.plan"):
        plan = build_plan(LaunchConfig(nproc_per_node=2), plugin_manager, ENTRY)
    assert plan.workers.base_env["OMP_NUM_THREADS"] == "1"
    assert "setting OMP_NUM_THREADS=1 for each worker" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="launcher.plan"):
        plan = build_plan(LaunchConfig(nproc_per_node=1), plugin_manager, ENTRY)
    assert "OMP_NUM_THREADS" not in plan.workers.base_env and not caplog.text


def test_hang_settings(plugin_manager):
    plan = build_plan(LaunchConfig(hang_timeout=30, hang_watch="output"), plugin_manager, ENTRY)
    assert plan.hangs is not None and plan.hangs.timeout == 30 and plan.hangs.watch_output


def test_preemption_settings(plugin_manager):
    assert build_plan(LaunchConfig(), plugin_manager, ENTRY).preemption is None  # off: SIGTERM as torchrun
    from launcher.preemption.settings import preemption_settings

    config = LaunchConfig(settings={"preemption": preemption_settings(signals="USR1")}, signals_to_handle=("SIGTERM",))
    plan = build_plan(config, plugin_manager, ENTRY)
    assert plan.preemption is not None and plan.preemption.grace == 30.0  # --shutdown-timeout's default
    # A preemption signal is caught whether or not --signals-to-handle names it.
    assert plan.signals == (signal.SIGTERM, signal.SIGUSR1) and plan.signal_names == ("SIGTERM",)


def test_format_cpus():
    assert format_cpus(frozenset({0, 1, 2, 3, 8, 10, 11})) == "0-3,8,10-11"
    assert format_cpus(None) == "" and format_cpus(frozenset()) == ""


def test_watch_outcomes_are_an_enum():
    assert WatchOutcome("failed") is WatchOutcome.FAILED
    assert {o.name for o in WatchOutcome} == {
        "SUCCEEDED", "FAILED", "HUNG", "MEMBERSHIP", "SIGNAL", "CLOSED", "STORE_GONE", "PREEMPTED",
    }


def test_the_signal_forwarder_restores_what_it_replaced():
    before = signal.getsignal(signal.SIGUSR1)
    hurried = []
    with SignalForwarder([signal.SIGUSR1], hurry=lambda signum, first: hurried.append((signum, first))) as forwarder:
        assert forwarder.wakeup_fd is not None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert forwarder.received == signal.SIGUSR1 and hurried == [(signal.SIGUSR1, True)]
        os.kill(os.getpid(), signal.SIGUSR1)
        assert hurried[-1] == (signal.SIGUSR1, False)  # a second signal: the agent hurries the stop
        with pytest.raises(SignalReceived), forwarder.interruptible():
            pass  # a signal already received ends a wait before it starts
    assert signal.getsignal(signal.SIGUSR1) is before
    assert forwarder.wakeup_fd is None


def test_a_signal_ends_an_interruptible_wait_at_once_and_only_once():
    before = signal.getsignal(signal.SIGUSR1)
    with SignalForwarder([signal.SIGUSR1], hurry=lambda signum, first: None) as forwarder:
        started = time.monotonic()
        with pytest.raises(SignalReceived) as caught, forwarder.interruptible():
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(30)  # ended by the handler, not waited out
        assert caught.value.name == "SIGUSR1" and time.monotonic() - started < 10
        os.kill(os.getpid(), signal.SIGUSR1)  # outside the block: recorded, not raised
        assert forwarder.received == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) is before
    assert forwarder.wakeup_fd is None


class _NobodyCame:
    """A rendezvous that fails, and records how the agent leaves it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def next_rendezvous(self):
        raise RendezvousError("nobody came")

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        self.calls.append("set_closed")

    def shutdown(self) -> bool:
        self.calls.append("shutdown")
        return True


def test_the_agent_closes_what_it_opened_when_the_rendezvous_fails(plugin_manager, tmp_path):
    plan = build_plan(LaunchConfig(log_dir=str(tmp_path)), plugin_manager, ENTRY)
    handler = _NobodyCame()
    before = signal.getsignal(signal.SIGTERM)
    result = Agent(plan, handler=handler).run()  # type: ignore[arg-type]
    assert result.exit_code == 1 and result.message == "rendezvous failed: nobody came"
    assert handler.calls == ["set_closed", "shutdown"]
    assert signal.getsignal(signal.SIGTERM) is before


# -- the import graph ---------------------------------------------------------------------------


def _module_level_imports(path: Path, module: str) -> set[str]:
    """Modules ``path`` imports when it is imported (not inside functions, not for type checkers)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                test = node.test
                if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
                ):
                    visit(node.orelse)
                    continue
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                visit(node.body)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module or ""
                found.add(name)
                found.update(f"{name}.{alias.name}" for alias in node.names)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


def _import_graph() -> dict[str, set[str]]:
    files = {}
    for path in (CORE / "launcher").rglob("*.py"):
        parts = list(path.relative_to(CORE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    graph = {}
    for module, path in files.items():
        edges = set()
        for name in _module_level_imports(path, module):
            parts = name.split(".")
            for end in range(1, len(parts) + 1):
                target = ".".join(parts[:end])
                # A package is always imported before its modules: that edge is no circle.
                if target in files and target != module and not module.startswith(target + "."):
                    edges.add(target)
        graph[module] = edges
    return graph


def test_no_import_circle_in_the_core():
    graph = _import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circle = path[path.index(target):] + [target]
                pytest.fail("import circle: " + " -> ".join(circle))
            if target not in state:
                walk(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)


def test_the_command_lines_settings_objects_reach_the_plan_and_the_sinks(plugin_manager, tmp_path):
    """Each group's object, a plugin's included, is one the plan and an event sink can read."""
    from launcher.command_line import read_command_line
    from launcher.flags import Flag, FlagGroup
    from launcher.options import core_groups, parse_args

    plugin = FlagGroup(name="acme", title="acme", flags=(Flag("--acme-level", default="3", help=""),),
                       read=lambda values: int(values["acme_level"]))
    groups = (*core_groups(), plugin)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    args = parse_args(["--standalone", "--hang-timeout", "30", "--acme-level", "7", str(script)], groups)
    command_line = read_command_line(args, plugin_manager, groups=groups)
    settings = command_line.settings
    assert settings["acme"] == 7 and settings["hangs"].timeout == 30.0 and settings["hangs"].watch == "heartbeat"
    assert settings["workers"].command[-1] == str(script)
    api_config = LaunchConfig.from_settings(settings)
    for plan in (command_line.plan(plugin_manager), build_plan(api_config, plugin_manager, ENTRY)):
        assert plan.settings["acme"] == 7 and plan.events.context.settings["acme"] == 7
        assert plan.hangs is not None and plan.hangs.timeout == 30.0
    # The Python API passes a plugin's settings the same way.
    api = build_plan(LaunchConfig(settings={"acme": 1}), plugin_manager, ENTRY)
    assert api.events.context.settings["acme"] == 1 and api.hangs is None


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def test_the_config_only_reads_values():
    """``launcher.config`` resolves no plugin: not even inside a function does it import one.

    It reads values with the flag groups' settings modules (``launcher.rendezvous.settings``...),
    which resolve no plugin either (the device kind ``--nproc-per-node`` names is counted by the
    command line's reader only, through the plugin manager it is given).
    """
    imported = _imported(CORE / "launcher" / "config.py")
    settings = {m for m in imported if m.endswith(".settings")}
    assert len(settings) >= 5
    plugin_parts = ("launcher.plugins", "launcher.rendezvous", "launcher.devices")
    assert not {m for m in imported - settings if m.startswith(plugin_parts)}
    for module in settings:
        path = CORE / (module.replace(".", "/") + ".py")
        reach = {m for m in _imported(path) if m.startswith(plugin_parts) and not m.endswith(".endpoint")}
        assert reach <= {"launcher.devices", "launcher.plugins.manager", "launcher.plugins.types"}, (module, reach)
