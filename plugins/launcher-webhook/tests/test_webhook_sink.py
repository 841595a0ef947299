"""The webhook sink against real HTTP servers on loopback: up, down, slow, failing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import launcher_webhook.plugin
import pytest
from launcher.events import EventBus, create_event_bus
from launcher.events.model import Event, EventSinkError, SinkContext
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import EventHandler
from launcher_webhook.sink import WebhookSettings, WebhookSink, create_webhook_sink, redact
from webhook_servers import Behaviour, EventServer

StartServer = Callable[[Behaviour], EventServer]


def _context(url: str, **settings: str) -> SinkContext:
    environ = {"LAUNCHER_WEBHOOK_URL": url, "LAUNCHER_WEBHOOK_BACKOFF": "0.01", **settings}
    return SinkContext(run_id="job-1", node="node-a", role="trainer", environ=environ)


def _event(i: int) -> Event:
    return Event("worker_failed", "job-1", "node-a", "trainer", 1700000000.0 + i, data={"rank": i})


def _emit_all(sink: WebhookSink, count: int) -> float:
    """Emit ``count`` events; the longest single emit, in seconds."""
    longest = 0.0
    for i in range(count):
        started = time.perf_counter()
        sink.emit(_event(i))
        longest = max(longest, time.perf_counter() - started)
    return longest


def test_batches_reach_an_accepting_server(event_server: StartServer) -> None:
    server = event_server(lambda n: (200, 0.0))
    sink = create_webhook_sink(
        _context(server.url, LAUNCHER_WEBHOOK_BATCH_SIZE="10", LAUNCHER_WEBHOOK_TOKEN="t0k")
    )
    _emit_all(sink, 35)
    sink.close()
    received = server.delivered()
    assert [e["data"]["rank"] for e in received] == list(range(35))  # all, in order
    assert all(len(r.body["events"]) <= 10 for r in server.requests)
    first = server.requests[0]
    assert first.path == "/hooks/launcher?token=secret-in-query"
    assert first.headers["Content-Type"] == "application/json"
    assert first.headers["Authorization"] == "Bearer t0k"
    assert first.headers["X-Launcher-Batch-Id"] == first.body["batch_id"]
    assert first.body["source"] == "launcher" and first.body["schema_version"] == 1
    assert (first.body["run_id"], first.body["node"], first.body["role"]) == ("job-1", "node-a", "trainer")
    assert Event.from_dict(first.body["events"][0]) == _event(0)
    stats = sink.stats()
    assert stats.sent_events == 35 and stats.failed_events == 0 and stats.dropped_events == 0


def test_server_errors_are_retried_with_the_same_batch_id(event_server: StartServer) -> None:
    server = event_server(lambda n: (500, 0.0) if n < 2 else (200, 0.0))
    sink = create_webhook_sink(_context(server.url))
    sink.emit(_event(0))
    server.wait_for(1)
    sink.close()
    assert [r.status for r in server.requests] == [500, 500, 200]
    assert len({r.body["batch_id"] for r in server.requests}) == 1
    assert sink.stats().retries == 2 and sink.stats().sent_events == 1


def test_client_errors_are_not_retried(event_server: StartServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="launcher.events.webhook")
    server = event_server(lambda n: (400, 0.0))
    sink = create_webhook_sink(_context(server.url, LAUNCHER_WEBHOOK_BATCH_SIZE="1"))
    _emit_all(sink, 3)
    sink.close()
    assert len(server.requests) == 3  # one attempt per batch
    assert sink.stats().failed_events == 3
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("could not take" in m for m in warnings) == 1  # reported once
    assert any("3 not delivered" in m for m in warnings)  # then summarised
    assert not any("secret-in-query" in m for m in warnings)  # the query may hold a secret


def test_server_down_never_blocks_emit(down_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="launcher.events.webhook")
    sink = create_webhook_sink(
        # The backoff keeps the sender on its first batch while the 500 events arrive.
        _context(
            down_url,
            LAUNCHER_WEBHOOK_RETRIES="2",
            LAUNCHER_WEBHOOK_BACKOFF="0.2",
            LAUNCHER_WEBHOOK_MAX_QUEUE="100",
        )
    )
    started = time.monotonic()
    _emit_all(sink, 500)
    # Blocking on the refused connection and its retries would take 20+ ms per event.
    assert time.monotonic() - started < 0.5
    started = time.monotonic()
    sink.close()
    assert time.monotonic() - started < 6.0
    stats = sink.stats()
    assert stats.sent_events == 0
    assert stats.dropped_events >= 300  # the queue holds 100, the first batch 50
    assert stats.failed_events + stats.dropped_events == 500
    messages = [r.getMessage() for r in caplog.records]
    assert sum("could not take" in m for m in messages) == 1
    assert sum("not keeping up" in m for m in messages) == 1
    assert any("ConnectionRefusedError" in m for m in messages)


def test_slow_server_times_out_and_retries(event_server: StartServer) -> None:
    # First answer takes 3 s (beyond the 0.3 s timeout), then answers come at once.
    server = event_server(lambda n: (200, 3.0) if n == 0 else (200, 0.0))
    sink = create_webhook_sink(_context(server.url, LAUNCHER_WEBHOOK_TIMEOUT="0.3"))
    started = time.monotonic()
    assert _emit_all(sink, 20) < 0.2  # a blocking emit would wait out the 0.3 s timeout
    sink.close()
    assert time.monotonic() - started < 3.0
    # The timed-out request was retried: everything arrived, the first batch perhaps twice
    # (a receiver drops the duplicate by batch_id).
    ranks = {e["data"]["rank"] for r in server.requests[1:] for e in r.body["events"]}
    assert ranks == set(range(20))
    assert sink.stats().retries >= 1 and sink.stats().failed_events == 0


def test_close_is_bounded_when_the_server_hangs(event_server: StartServer) -> None:
    server = event_server(lambda n: (200, 10.0))
    sink = create_webhook_sink(
        _context(server.url, LAUNCHER_WEBHOOK_TIMEOUT="30", LAUNCHER_WEBHOOK_CLOSE_TIMEOUT="1")
    )
    sink.emit(_event(0))
    time.sleep(0.2)  # the request is in flight with a 30 s timeout
    sink.emit(_event(1))
    started = time.monotonic()
    sink.close()
    assert time.monotonic() - started < 2.5
    assert sink.stats().sent_events == 0


def test_through_the_event_bus(event_server: StartServer, plugin_manager: LauncherPluginManager) -> None:
    # Registered directly here; the entry point is tested with a real install.
    if "webhook" not in plugin_manager.names(EventHandler):
        plugin_manager.register_plugin(launcher_webhook.plugin)
    server = event_server(lambda n: (503, 0.0) if n == 0 else (200, 0.0))
    bus = create_event_bus(["console", "webhook"], plugin_manager, _context(server.url))
    assert isinstance(bus, EventBus) and bus.sink_names == ["console", "webhook"]
    started = time.monotonic()
    bus.emit("rendezvous_started", restart_count=0)
    bus.emit("job_succeeded", restart_count=0)
    assert time.monotonic() - started < 0.5
    assert bus.close(timeout=5)
    assert [e["type"] for e in server.delivered()] == ["rendezvous_started", "job_succeeded"]


def test_settings_are_checked_before_the_job_starts() -> None:
    with pytest.raises(EventSinkError, match="needs LAUNCHER_WEBHOOK_URL"):
        create_webhook_sink(SinkContext("r", "n", "x", environ={}))
    with pytest.raises(EventSinkError, match="http:// or https://"):
        create_webhook_sink(_context("ftp://example.com/x"))
    with pytest.raises(EventSinkError, match="LAUNCHER_WEBHOOK_TIMEOUT='soon' is not a number"):
        create_webhook_sink(_context("http://127.0.0.1:9/x", LAUNCHER_WEBHOOK_TIMEOUT="soon"))
    with pytest.raises(EventSinkError, match="LAUNCHER_WEBHOOK_BATCH_SIZE"):
        create_webhook_sink(_context("http://127.0.0.1:9/x", LAUNCHER_WEBHOOK_BATCH_SIZE="0"))
    settings = WebhookSettings.from_context(
        _context("https://h/x", LAUNCHER_WEBHOOK_RETRIES="0", LAUNCHER_WEBHOOK_MAX_QUEUE="7")
    )
    assert (settings.retries, settings.max_queue, settings.timeout) == (0, 7, 5.0)


def test_redact() -> None:
    assert redact("https://user:pw@host:8443/p/q?token=x#f") == "https://host:8443/p/q"
    assert redact("http://[::1]:9000/e") == "http://[::1]:9000/e"


def test_emit_is_thread_safe(event_server: StartServer) -> None:
    server = event_server(lambda n: (200, 0.0))
    sink = create_webhook_sink(_context(server.url, LAUNCHER_WEBHOOK_MAX_QUEUE="10000"))
    threads = [threading.Thread(target=_emit_all, args=(sink, 100)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sink.close()
    assert sink.stats().sent_events == 400


def test_readme_documents_every_setting() -> None:
    import launcher_webhook.sink as sink_module
    from webhook_servers import PLUGIN_ROOT

    readme = (PLUGIN_ROOT / "README.md").read_text()
    settings = [value for name, value in vars(sink_module).items() if name.endswith("_SETTING")]
    assert len(settings) == 8
    for setting in settings:
        assert f"| `{setting}` |" in readme, setting
    from launcher_webhook.settings import FLAGS

    for flag in FLAGS.flags:  # each flag beside the variable it falls back on
        assert f"| `{flag.name}` | `{flag.env}` |" in readme, flag.name
