"""The agent's end of the workers' control channel for recovery in place.

One abstract Unix stream socket per agent, named after the job's token
(:func:`launcher.recovery.socket_address`; :mod:`launcher.recovery.worker` describes the
messages). A daemon thread accepts the workers' connections and reads their messages. A
connection is a slot's worker when the kernel says its process is the pid the agent started in
that slot (``SO_PEERCRED``): a child of a worker, which inherits the token, or any other process
is refused. Until the agent has said which pids its workers are (:meth:`ControlServer.expect`),
a registration waits for the answer. A worker's report that its function raised makes
:attr:`ControlServer.wakeup_fd` readable, so the agent's watch loop, which selects on it beside
the workers' exit descriptors, sees it at once.

Nothing here runs before the first worker starts but one ``bind`` and one thread start.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from launcher.recovery import socket_address

__all__ = ["ControlServer", "WorkerLink"]

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


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


class ControlServer:
    """The listening socket, its reader thread and what each slot's worker said last."""

    def __init__(self, token: str) -> None:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(socket_address(token))
        self._listener.listen(256)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._lock = threading.Condition()
        self._links: dict[int, WorkerLink] = {}
        #: pid -> slot, once the agent said (None before: registrations wait in ``_pending``).
        self._expected: dict[int, int] | None = None
        self._pending: list[tuple[socket.socket, int]] = []
        #: slot -> pid of registered workers whose connection closed on their side (they are
        #: exiting: the kernel closes a dying process's sockets before its parent can reap it).
        self._hung_up: dict[int, int] = {}
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

    # -- the agent's side ----------------------------------------------------------------------

    def expect(self, pids: dict[int, int]) -> None:
        """The workers now: their pid by slot. Their registrations are accepted, any other refused."""
        with self._lock:
            self._expected = {pid: slot for slot, pid in pids.items()}
            for link in list(self._links.values()):  # a link of a process that ended
                if self._expected.get(link.pid) != link.slot:
                    self._drop(link)
            pending, self._pending = self._pending, []
            for conn, pid in pending:
                self._decide(conn, pid)

    def hold(self) -> None:
        """New workers are starting: registrations wait for the next :meth:`expect` (their pids
        are not known yet, and must not be refused meanwhile)."""
        with self._lock:
            self._expected = None

    def link(self, slot: int) -> WorkerLink | None:
        """The worker of ``slot``, if it registered."""
        with self._lock:
            return self._links.get(slot)

    def hung_up(self, slot: int, pid: int) -> bool:
        """Whether the worker ``pid`` of ``slot`` had registered and its connection then closed on
        its side: it is exiting, even when its exit cannot be reaped yet."""
        with self._lock:
            return self._hung_up.get(slot) == pid

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

    def drain_wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.read(self._wake_r, 4096)

    def close(self) -> None:
        """Stop the thread and close every connection (the workers then leave on their own)."""
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        self._thread.join(timeout=5.0)
        with self._lock:
            for link in list(self._links.values()):
                self._drop(link)
                link.conn.close()
            for conn, _ in self._pending:
                conn.close()
            self._pending.clear()
        self._selector.close()
        self._listener.close()
        for fd in (self._wake_r, self._wake_w, self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)

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
            op = json.loads(line)["op"]
        except (ValueError, KeyError, TypeError):
            return
        with self._lock:
            if op == "register":
                try:
                    pid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[0]
                except OSError:
                    return
                if self._expected is None:
                    self._pending.append((conn, pid))  # answered once the agent says who its workers are
                else:
                    self._decide(conn, pid)
            else:
                link = next((item for item in self._links.values() if item.conn is conn), None)
                if link is None:
                    return
                if op == "raised":
                    message = json.loads(line)
                    link.state, link.error, link.raised_at = "raised", str(message.get("error", "")), time.time()
                    with contextlib.suppress(OSError):
                        os.write(self._wake_w, b"r")
                elif op in ("left", "done"):
                    link.state = op
            self._lock.notify_all()

    def _decide(self, conn: socket.socket, pid: int) -> None:
        assert self._expected is not None
        slot = self._expected.get(pid)
        if slot is None:  # not a worker of this attempt: a child of one, or a stranger
            with contextlib.suppress(OSError):
                conn.sendall(b'{"op": "no"}\n')
            return
        old = self._links.get(slot)
        if old is not None and old.conn is not conn:
            self._drop(old)
        self._links[slot] = WorkerLink(slot, pid, conn)
        with contextlib.suppress(OSError):
            conn.sendall(b'{"op": "ok"}\n')

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
                    self._hung_up[link.slot] = link.pid
            self._pending = [(c, pid) for c, pid in self._pending if c is not conn]
            self._lock.notify_all()
        with contextlib.suppress(OSError):
            conn.close()
