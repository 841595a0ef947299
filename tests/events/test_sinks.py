"""The built-in sinks, resolved through the plugin manager as the agent does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from launcher.errors import UsageError
from launcher.events import create_event_bus
from launcher.events.model import Event, EventSinkError, SinkContext
from launcher.plugins import hookimpl
from launcher.plugins.manager import LauncherPluginManager, PluginNotFoundError
from launcher.plugins.types import EventHandler

from .conftest import ListSink

DOCS = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def _context(**environ: str) -> SinkContext:
    return SinkContext(run_id="job-1", node="node-a", role="trainer", environ=environ)


def test_builtins_come_from_the_core_distribution(plugin_manager: LauncherPluginManager) -> None:
    for name in ("null", "dynamic_rendezvous", "console", "jsonl"):
        provided = plugin_manager.lookup(EventHandler, name)
        assert provided.plugin.distribution == "launcher-core"
    assert plugin_manager.get(EventHandler, "dynamic_rendezvous") is plugin_manager.get(
        EventHandler, "null"
    )


def test_builtin_plugin_import_is_cheap() -> None:
    code = (
        "import sys, launcher.plugins.builtin.event_handlers as m; "
        "print(any(n in sys.modules for n in ('torch', 'launcher.events.sinks', 'launcher.events.bus')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_null_gets_no_thread(plugin_manager: LauncherPluginManager) -> None:
    before = threading.active_count()
    bus = create_event_bus(["null", "dynamic_rendezvous"], plugin_manager, _context())
    assert bus.sink_names == []
    assert threading.active_count() == before
    bus.emit("job_succeeded")
    assert bus.close()


def test_console_one_line_per_event(
    plugin_manager: LauncherPluginManager, capsys: pytest.CaptureFixture[str]
) -> None:
    bus = create_event_bus(["console"], plugin_manager, _context())
    bus.emit("worker_failed", rank=3, local_rank=1, pid=4242, exitcode=None, signal=9)
    bus.emit("job_failed", reason="worker failure", failures=1)
    assert bus.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(
        r"\[launcher event\] \d\d:\d\d:\d\d\.\d{3}Z worker_failed run=job-1 node=node-a role=trainer "
        r"rank=3 local_rank=1 pid=4242 exitcode=null signal=9",
        lines[0],
    )
    assert lines[1].endswith(
        'job_failed run=job-1 node=node-a role=trainer reason="worker failure" failures=1'
    )


def test_jsonl_appends_lines(plugin_manager: LauncherPluginManager, tmp_path: Path) -> None:
    template = str(tmp_path / "events" / "{run_id}-{node}.jsonl")
    path = tmp_path / "events" / "job-1-node-a.jsonl"
    path.parent.mkdir()
    path.write_text('{"earlier": true}\n')
    bus = create_event_bus(["jsonl"], plugin_manager, _context(LAUNCHER_EVENTS_FILE=template))
    sent = [bus.emit("rendezvous_started", restart_count=0), bus.emit("job_succeeded", restart_count=0)]
    assert bus.close()
    lines = path.read_text().splitlines()
    assert lines[0] == '{"earlier": true}'
    assert [Event.from_json(line) for line in lines[1:]] == sent


def test_jsonl_needs_its_setting(plugin_manager: LauncherPluginManager, tmp_path: Path) -> None:
    with pytest.raises(EventSinkError, match="LAUNCHER_EVENTS_FILE") as info:
        create_event_bus(["jsonl"], plugin_manager, _context())
    assert isinstance(info.value, UsageError)  # one line, exit status 2, before workers start
    with pytest.raises(EventSinkError, match=r"only \{run_id\}"):
        create_event_bus(
            ["jsonl"], plugin_manager, _context(LAUNCHER_EVENTS_FILE=str(tmp_path / "{host}.jsonl"))
        )
    with pytest.raises(EventSinkError, match="cannot open events file"):
        create_event_bus(["jsonl"], plugin_manager, _context(LAUNCHER_EVENTS_FILE=str(tmp_path)))


def test_unknown_name_lists_the_choices(plugin_manager: LauncherPluginManager) -> None:
    with pytest.raises(PluginNotFoundError, match="console.*jsonl.*null") as info:
        create_event_bus(["console", "kafka"], plugin_manager, _context())
    assert "pip install" not in str(info.value)  # no made-up distribution name


def test_sink_that_cannot_start_closes_the_others(
    plugin_manager: LauncherPluginManager, register_plugin: Callable[[object], object]
) -> None:
    opened: list[ListSink] = []

    def good(context: SinkContext) -> ListSink:
        opened.append(ListSink())
        return opened[-1]

    def broken(context: SinkContext) -> ListSink:
        raise ConnectionRefusedError("no broker")

    class Plugin:
        @hookimpl
        def launcher_event_handlers(self) -> Iterator[EventHandler]:
            yield EventHandler(name="good", create_sink=good)
            yield EventHandler(name="broken", create_sink=broken)

    register_plugin(Plugin())
    with pytest.raises(EventSinkError, match="'broken' could not start: ConnectionRefusedError: no broker"):
        create_event_bus(["good", "broken"], plugin_manager, _context())
    assert opened and opened[0].closed.is_set()


def test_queue_size_setting(plugin_manager: LauncherPluginManager) -> None:
    with pytest.raises(EventSinkError, match="LAUNCHER_EVENTS_QUEUE_SIZE"):
        create_event_bus(["console"], plugin_manager, _context(LAUNCHER_EVENTS_QUEUE_SIZE="0"))


def test_documented_example_sink_works(
    plugin_manager: LauncherPluginManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    plugin_source = next(block for block in blocks if "launcher_event_handlers" in block)
    module_path = tmp_path / "my_launcher_counts.py"
    module_path.write_text(plugin_source)
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_launcher_counts

    plugin_manager.register_plugin(my_launcher_counts)
    counts = tmp_path / "counts.json"
    with pytest.raises(EventSinkError, match="MY_COUNTS_FILE"):
        create_event_bus(["counts"], plugin_manager, _context())

    # The docs' "try it" snippet, with the settings this test needs.
    try_it = next(block for block in blocks if "create_event_bus" in block)
    monkeypatch.setenv("MY_COUNTS_FILE", str(counts))
    namespace = {"my_launcher_counts": my_launcher_counts}
    exec(compile(try_it, str(DOCS), "exec"), namespace)
    assert json.loads(counts.read_text()) == {"node": "here", "counts": {"job_succeeded": 1}}
