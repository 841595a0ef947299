"""Fixtures for the webhook sink's tests: real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest
from webhook_servers import Behaviour, EventServer


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # urllib honours proxy variables; loopback requests must not go through one.
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture
def event_server() -> Iterator[Callable[[Behaviour], EventServer]]:
    """``event_server(behaviour)`` starts a server; all are stopped after the test."""
    started: list[EventServer] = []

    def start(behaviour: Behaviour) -> EventServer:
        started.append(EventServer(behaviour).start())
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def down_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/events"
