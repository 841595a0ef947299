"""The command line and the Python API describe a launch with the same settings objects.

The command line's flag groups read each value once into their settings objects and the plan is
built from those (``launcher.command_line``); :class:`LaunchConfig` converts its torch-compatible
fields into the same objects (``to_settings``). These tests hold the two ways together: the same
settings both ways, and the same plan.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from launcher.command_line import CommandLine, read_command_line
from launcher.config import LaunchConfig
from launcher.options import core_groups, parse_args
from launcher.plan import LaunchPlan, build_plan

#: What only the command line has: the workers' command, --standalone's spelling. The API passes
#: its entrypoint to the plan, and a standalone config is the c10d backend at localhost:0.
_COMMAND_ONLY = {"workers": ("command", "run_path", "no_python"), "rendezvous": ("standalone",)}

COMMAND_LINES = {
    "standalone": ["--standalone", "--nproc-per-node", "2"],
    "elastic": [
        "--nnodes", "1:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:29400", "--rdzv-id", "job7",
        "--rdzv-conf", "join_timeout=60", "--nproc-per-node", "2", "--max-restarts", "2",
        "--monitor-interval", "5", "--role", "trainer", "--signals-to-handle", "SIGTERM,SIGUSR1",
        "--shutdown-timeout", "10", "--exit-barrier-timeout", "20", "--event-log-handler", "console,null",
        "-r", "0:1,1:2", "-t", "3", "--local-ranks-filter", "0", "--duplicate-stdout-filters", "a,,b,c",
        "--duplicate-stderr-filters", "err", "--hang-timeout", "30", "--hang-watch", "output",
        "--worker-tty", "never", "--local-addr", "127.0.0.1",
    ],  # fmt: skip
    "static": ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29501"],
    "preload": ["--standalone", "--preload", "json,os", "--numa-fallback", "error"],
    "capabilities": [
        "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--health-checks", "disk",
        "--straggler-detection", "--straggler-threshold", "3", "--straggler-action", "exclude",
        "--straggler-interval", "5", "--metrics-port", "0", "--recovery", "in-place", "--preemption-grace", "30",
        "--preemption-signals", "SIGTERM,SIGUSR1", "--max-restarts", "1",
    ],  # fmt: skip
}


def _command_line(argv: list[str], tmp_path: Path, manager: Any) -> CommandLine:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    groups = core_groups()
    args = parse_args([*argv, str(script)], groups)
    return read_command_line(args, manager, environ={}, groups=groups)


def _without_command_only(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with what only the command line says cleared from its objects."""
    cleared = dict(settings)
    for name, fields in _COMMAND_ONLY.items():
        cleared[name] = cleared[name]._replace(**{field: None for field in fields})
    return cleared


def _comparable(plan: LaunchPlan) -> dict[str, Any]:
    """The plan's fields, the objects that compare by identity replaced by what they hold."""
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    fields["logs_specs"] = (type(plan.logs_specs), vars(plan.logs_specs))
    fields["events"] = (plan.events.handlers, plan.events.context)
    fields["health"] = repr(plan.health)
    fields["settings"] = _without_command_only(dict(plan.settings))
    return fields


@pytest.mark.parametrize("name", sorted(COMMAND_LINES))
def test_the_flags_and_the_config_give_the_same_settings(name, tmp_path, plugin_manager):
    command_line = _command_line(COMMAND_LINES[name], tmp_path, plugin_manager)
    settings = command_line.settings
    config = LaunchConfig.from_settings(settings, log_line_prefix_template=command_line.prefix_template)
    again = config.to_settings(settings["workers"].device_provider)
    assert list(again) == list(settings)  # every group, in the command line's order
    assert _without_command_only(again) == _without_command_only(settings)


@pytest.mark.parametrize("name", sorted(COMMAND_LINES))
def test_the_flags_and_the_config_give_the_same_plan(name, tmp_path, plugin_manager, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    command_line = _command_line(COMMAND_LINES[name], tmp_path, plugin_manager)
    config = LaunchConfig.from_settings(command_line.settings, log_line_prefix_template="[{rank}]")
    command_line.prefix_template = "[{rank}]"
    from_flags = command_line.plan(plugin_manager)
    from_config = build_plan(config, plugin_manager, command_line.entrypoint(),
                             device_provider=command_line.settings["workers"].device_provider)
    assert _comparable(from_flags) == _comparable(from_config)


def test_a_config_written_by_hand_gives_the_standalone_flags_settings(tmp_path, plugin_manager):
    """What ``--standalone --nproc-per-node 2`` means, written as the Python API's fields."""
    settings = _command_line(COMMAND_LINES["standalone"], tmp_path, plugin_manager).settings
    config = LaunchConfig(nproc_per_node=2, rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                          run_id=settings["rendezvous"].run_id)
    written = config.to_settings()
    for name in ("rendezvous", "workers", "logs", "numa", "hangs", "events", "preload"):
        assert _without_command_only(written)[name] == _without_command_only(settings)[name], name


@pytest.mark.parametrize("name", sorted(COMMAND_LINES))
def test_each_flags_value_is_read_once_on_the_way_to_the_plan(name, tmp_path, plugin_manager, monkeypatch):
    """From the parsed command line to the plan, each flag's value is read by one settings module, once."""
    from launcher.flags import FlagValues

    reads: dict[str, int] = {}
    read = FlagValues.__getitem__

    def counted(self: FlagValues, key: str) -> Any:
        reads[key] = reads.get(key, 0) + 1
        return read(self, key)

    monkeypatch.setattr(FlagValues, "__getitem__", counted)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    _command_line(COMMAND_LINES[name], tmp_path, plugin_manager).plan(plugin_manager)
    assert reads and {key: n for key, n in reads.items() if n > 1} == {}, reads
