"""A hostile store client for the tests: pipelines GETs of a large value and never reads a reply."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from launcher.store.server import VALIDATION_MAGIC, QueryType

VALUE_SIZE = 1 << 20
KEY = b"/flood"


def blob(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def get_request(key: bytes = KEY) -> bytes:
    return bytes([QueryType.GET]) + blob(key)


def flood(host: str, port: int, request_bytes: int, *, stall_s: float = 2.0) -> socket.socket:
    """Connect, store a 1 MiB value, then send about ``request_bytes`` of GETs for it without
    reading anything. Stops early when the server stops reading (sends stall for ``stall_s``).
    Returns the open socket: the flood lasts as long as the caller keeps it."""
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(struct.pack("<BI", QueryType.VALIDATE, VALIDATION_MAGIC))
    sock.sendall(bytes([QueryType.SET]) + blob(KEY) + blob(b"x" * VALUE_SIZE))
    chunk = get_request() * 1000
    sock.settimeout(stall_s)
    sent = 0
    while sent < request_bytes:
        try:
            sent += sock.send(chunk)
        except TimeoutError:
            break  # the server stopped reading us: its pushback works
    return sock


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """``VmRSS`` (or ``VmHWM``, the peak) of process ``pid``, in bytes; 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def watch_peak_rss(pid: int, until: float) -> int:
    """Highest VmRSS of ``pid`` seen by polling until the monotonic time ``until`` (or its exit)."""
    peak = 0
    while time.monotonic() < until:
        rss = rss_bytes(pid)
        if rss == 0:
            break
        peak = max(peak, rss, rss_bytes(pid, "VmHWM"))
        time.sleep(0.05)
    return peak
