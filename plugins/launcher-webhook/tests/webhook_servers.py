"""Loopback HTTP servers for the webhook sink's tests (used by conftest.py and the tests).

This directory is deliberately not a package: the repository's top-level ``tests`` package would
otherwise clash with it (both would be imported as ``tests``) when both run in one pytest session.
Importing this module also puts the plugin's source on ``sys.path``, so the tests run against it
without an install (the install itself is tested in ``test_webhook_install.py``).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PLUGIN_ROOT = Path(__file__).resolve().parents[1]
if str(PLUGIN_ROOT) not in sys.path:
    sys.path.insert(0, str(PLUGIN_ROOT))

#: What a server does with each request, by request number (from 0): (status, delay seconds).
Behaviour = Callable[[int], tuple[int, float]]


@dataclass
class Received:
    """One request as the server saw it, and the status it answered."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int


@dataclass
class EventServer:
    """A loopback HTTP server that records each POST and answers as ``behaviour`` says."""

    behaviour: Behaviour
    requests: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/hooks/launcher?token=secret-in-query"

    def delivered(self) -> list[dict[str, Any]]:
        """Events of the requests that were answered with success, in arrival order."""
        return [event for r in self.requests if 200 <= r.status < 300 for event in r.body["events"]]

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.delivered()) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    def start(self) -> EventServer:
        lock = threading.Lock()
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with lock:
                    status, delay = state.behaviour(len(state.requests))
                    state.requests.append(Received(self.path, dict(self.headers), body, status))
                time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:  # the client gave up (timeout)
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True  # a handler sleeping for a slow answer must not block exit
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
