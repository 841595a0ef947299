"""The agent's end of the workers' control channel for recovery in place.

One Unix stream socket per agent, in a private directory (mode 0700), named to each worker in its
environment with its slot (:mod:`launcher.recovery.worker` describes the messages). A daemon
thread accepts the workers' connections and reads their messages; it answers a registration only
once the agent has said which pid each slot's worker has (:meth:`ControlServer.expect`), so that
a child of a worker, which inherits the same variables, never passes for it. A worker's report
that its function raised makes :attr:`ControlServer.wakeup_fd` readable, so the agent's watch
loop, which selects on it beside the workers' exit descriptors, sees it at once.

Nothing here runs before the first worker starts but one ``bind`` and one thread start.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from launcher.private_dirs import make_private_dir, temp_root
from launcher.recovery import SLOT_ENV, SOCKET_ENV

__all__ = ["ControlServer", "WorkerLink"]

#: Longest socket path Linux accepts is 107 bytes; a deep $TMPDIR falls back to /tmp.
_MAX_PATH = 100


@dataclass
class WorkerLink:
    """What the agent knows of one slot's worker on the channel."""

    slot: int
    pid: int
    conn: socket.socket
    #: ``running`` (inside its function), ``raised``, ``left``, ``done``.
    state: str = "running"
    #: ``Type: message`` of the exception it reported.
    error: str = ""
    #: When it reported ``raised`` (``time.time()``).
    raised_at: float = 0.0
    #: Whether the agent accepted it (its pid is the slot's worker).
    accepted: bool = False


class ControlServer:
    """The listening socket, its reader thread and what each slot's worker said last."""

    def __init__(self) -> None:
        root = temp_root()
        if len(root) > _MAX_PATH - 40:
            root = "/tmp"
        self.dir = make_private_dir("launcher_recovery_", root)
        self.path = os.path.join(self.dir, "control.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(256)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._lock = threading.Condition()
        self._links: dict[int, WorkerLink] = {}
        self._expected: dict[int, int] = {}
        self._closing = False
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._stop_r, self._stop_w = os.pipe()
        self._selector.register(self._stop_r, selectors.EVENT_READ, "stop")
        self._thread = threading.Thread(target=self._serve, name="launcher-recovery-channel", daemon=True)
        self._thread.start()

    @property
    def wakeup_fd(self) -> int:
        """Readable when a worker reported that its function raised."""
        return self._wake_r

    def environment(self, local_rank: int) -> dict[str, str]:
        """The variables that name the channel to the worker of ``local_rank``."""
        return {SOCKET_ENV: self.path, SLOT_ENV: str(local_rank)}

    # -- the agent's side ----------------------------------------------------------------------

    def expect(self, slot: int, pid: int) -> None:
        """The worker of ``slot`` is ``pid``: its registration is accepted, any other refused."""
        with self._lock:
            self._expected[slot] = pid
            link = self._links.get(slot)
            if link is not None and link.pid != pid:
                self._drop(link)
            elif link is not None and not link.accepted:
                self._accept(link)

    def link(self, slot: int) -> WorkerLink | None:
        """The accepted worker of ``slot``, if it registered."""
        with self._lock:
            link = self._links.get(slot)
            return link if link is not None and link.accepted else None

    def send(self, slot: int, message: dict[str, Any]) -> bool:
        """Send ``message`` to the worker of ``slot``; whether it could be sent."""
        import json

        link = self.link(slot)
        if link is None:
            return False
        try:
            link.conn.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            return False
        return True

    def set_state(self, slot: int, state: str) -> None:
        """Note the worker of ``slot`` as ``state`` (``running``: resumed, its last error forgotten)."""
        with self._lock:
            link = self._links.get(slot)
            if link is not None:
                link.state = state
                if state == "running":
                    link.error, link.raised_at = "", 0.0

    def wait(self, timeout: float) -> None:
        """Block until a worker says something, or ``timeout`` seconds."""
        with self._lock:
            self._lock.wait(timeout)

    def forget(self, slot: int) -> None:
        """The worker of ``slot`` is gone: drop its connection."""
        with self._lock:
            link = self._links.get(slot)
            if link is not None:
                self._drop(link)
            self._expected.pop(slot, None)

    def drain_wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.read(self._wake_r, 4096)

    def close(self) -> None:
        """Stop the thread, close every connection and remove the socket's directory."""
        with self._lock:
            self._closing = True
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        self._thread.join(timeout=5.0)
        with self._lock:
            for link in list(self._links.values()):
                self._drop(link)
                link.conn.close()
        self._selector.close()
        self._listener.close()
        for fd in (self._wake_r, self._wake_w, self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)

    # -- the reader thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        buffers: dict[socket.socket, bytes] = {}
        while True:
            for key, _ in self._selector.select():
                if key.data == "stop":
                    return
                if key.data is None:
                    with contextlib.suppress(OSError):
                        conn, _ = self._listener.accept()
                        buffers[conn] = b""
                        self._selector.register(conn, selectors.EVENT_READ, "conn")
                    continue
                conn = key.fileobj  # type: ignore[assignment]
                try:
                    data = conn.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self._selector.unregister(conn)
                    buffers.pop(conn, None)
                    self._closed(conn)
                    continue
                buffers[conn] += data
                while b"\n" in buffers[conn]:
                    line, buffers[conn] = buffers[conn].split(b"\n", 1)
                    self._handle(conn, line)

    def _handle(self, conn: socket.socket, line: bytes) -> None:
        import json

        try:
            message = json.loads(line)
            op = message["op"]
        except (ValueError, KeyError, TypeError):
            return
        with self._lock:
            if op == "register":
                self._register(conn, message)
            else:
                link = next((item for item in self._links.values() if item.conn is conn), None)
                if link is None or not link.accepted:
                    return
                if op == "raised":
                    link.state, link.error, link.raised_at = "raised", str(message.get("error", "")), time.time()
                    with contextlib.suppress(OSError):
                        os.write(self._wake_w, b"r")
                elif op in ("left", "done"):
                    link.state = op
            self._lock.notify_all()

    def _register(self, conn: socket.socket, message: dict[str, Any]) -> None:
        try:
            slot, pid = int(message["slot"]), int(message["pid"])
        except (KeyError, TypeError, ValueError):
            return
        old = self._links.get(slot)
        if old is not None and old.conn is not conn:
            if old.pid == pid:  # the same worker calls its function again: the old link is stale
                self._drop(old)
            elif old.accepted:
                self._refuse(conn)
                return
        link = WorkerLink(slot, pid, conn)
        self._links[slot] = link
        expected = self._expected.get(slot)
        if expected == pid:
            self._accept(link)
        elif expected is not None:
            del self._links[slot]
            self._refuse(conn)

    def _accept(self, link: WorkerLink) -> None:
        link.accepted = True
        with contextlib.suppress(OSError):
            link.conn.sendall(b'{"op": "ok"}\n')

    def _refuse(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(b'{"op": "no"}\n')

    def _drop(self, link: WorkerLink) -> None:
        if self._links.get(link.slot) is link:
            del self._links[link.slot]
        with contextlib.suppress(OSError):
            link.conn.shutdown(socket.SHUT_RDWR)

    def _closed(self, conn: socket.socket) -> None:
        with self._lock:
            for link in list(self._links.values()):
                if link.conn is conn:
                    del self._links[link.slot]
            self._lock.notify_all()
        with contextlib.suppress(OSError):
            conn.close()
