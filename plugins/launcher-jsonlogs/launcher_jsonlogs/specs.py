"""The ``jsonlogs`` LogsSpecs and the sink that writes the JSON lines."""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any

from launcher.config import STD_ERR, STD_OUT
from launcher.logs.sink import LineOrigin, LineSink
from launcher.logs.specs import DefaultLogsSpecs, LogsDest, std_for

#: Buffered JSON is written out once it reaches this size (and at every flush).
_BUFFER_BYTES = 1 << 16


class JsonLinesSink(LineSink):
    """Appends one JSON object per worker line to ``path``."""

    def __init__(self, path: str, node: str) -> None:
        super().__init__()
        self.path = path
        self.node = node
        self._fd: int | None = None
        self._buffer: list[bytes] = []
        self._size = 0
        # The pump writes from its thread; the agent closes from its own.
        self._write_lock = threading.Lock()

    def describe(self) -> str:
        return self.path

    def open(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def write_lines(self, origin: LineOrigin, lines: bytes, timestamp: float) -> None:
        head: dict[str, Any] = {
            "timestamp": round(timestamp, 6),
            "node": self.node,
            "rank": origin.rank,
            "local_rank": origin.local_rank,
            "role": origin.role,
            "attempt": origin.restart_count,
            "stream": origin.stream,
        }
        encoded = []
        for line in lines[:-1].split(b"\n"):
            head["text"] = line.decode("utf-8", "backslashreplace")
            encoded.append(json.dumps(head, ensure_ascii=False).encode() + b"\n")
        data = b"".join(encoded)
        with self._write_lock:
            self._buffer.append(data)
            self._size += len(data)
            if self._size >= _BUFFER_BYTES:
                self._write_out()

    def _write_out(self) -> None:
        if not self._buffer or self._fd is None:
            return
        data = b"".join(self._buffer)
        self._buffer.clear()
        self._size = 0
        # One write per batch: with O_APPEND, agents sharing the file never split a line.
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def flush(self) -> None:
        with self._write_lock:
            self._write_out()

    def close(self) -> None:
        with self._write_lock:
            self._write_out()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class JsonLogsSpecs(DefaultLogsSpecs):
    """Every stream of every rank goes to ``<dir>/<run_id>/<hostname>.jsonl``.

    Error files (``TORCHELASTIC_ERROR_FILE``) stay in a private temporary directory, removed
    after a successful run. The console shows what is not redirected, as usual.
    """

    def __init__(
        self,
        log_dir: str | None = None,
        redirects: Any = 0,
        tee: Any = 0,
        local_ranks_filter: set[int] | None = None,
    ) -> None:
        directory = os.environ.get("LAUNCHER_JSONLOGS_DIR") or log_dir
        if not directory:
            raise ValueError("--logs-specs jsonlogs needs --log-dir DIR (or LAUNCHER_JSONLOGS_DIR)")
        # The parent only places error files; the JSON file replaces its stdout/stderr logs.
        super().__init__(log_dir=None, local_ranks_filter=local_ranks_filter)
        self.directory = directory
        self._json_redirects = redirects

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        first = envs.get(0, {})
        node = socket.gethostname()
        run_id = first.get("TORCHELASTIC_RUN_ID", "run")
        sink = JsonLinesSink(os.path.join(self.directory, run_id, f"{node}.jsonl"), node)
        for local_rank, env in envs.items():
            redirected = std_for(self._json_redirects, local_rank)
            shown = not self._local_ranks_filter or local_rank in self._local_ranks_filter
            for stream, bit, targets, tees in (
                ("stdout", STD_OUT, dest.stdouts, dest.tee_stdouts),
                ("stderr", STD_ERR, dest.stderrs, dest.tee_stderrs),
            ):
                origin = LineOrigin(
                    local_rank=local_rank,
                    rank=int(env.get("RANK", -1)),
                    stream=stream,
                    role=env.get("ROLE_NAME", "default"),
                    restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
                )
                targets[local_rank] = sink.destination(origin)
                if shown and not redirected & bit:
                    tees[local_rank] = targets[local_rank]
        return dest
