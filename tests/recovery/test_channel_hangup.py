"""A worker whose channel connection closed is dying, not one that never registered.

The kernel closes a dying process's sockets before its last thread has exited, so on a loaded
machine the agent can read the hang-up, and its peers' raise reports, before the exit can be
reaped (CI once restarted every worker for a SIGKILLed rank, saying it "did not register").
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

from launcher.recovery.inplace import InPlaceRecovery
from launcher.recovery.settings import RecoverySettings

#: A worker that registers, then closes its connection and lingers before exiting (a slow death).
DYING = textwrap.dedent("""
    import json, socket, sys, time
    from launcher.recovery import socket_address
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_address(sys.argv[1]))
    sock.sendall(b'{"op": "register"}\\n')
    assert json.loads(sock.makefile("rb").readline())["op"] == "ok"
    print("registered", flush=True)
    sys.stdin.readline()
    sock.close()
    time.sleep(float(sys.argv[2]))
""")


class Slot(SimpleNamespace):
    """What the recovery reads of a worker slot: its local rank and its process."""


class Process:
    """A real child process, through the two things the recovery asks of a worker process."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self._popen.poll()
        return self.returncode


class Group(SimpleNamespace):
    def wait(self, timeout: float) -> None:
        time.sleep(timeout)


def start(token: str, linger: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DYING, token, str(linger)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_a_registered_worker_that_hung_up_is_waited_for_not_called_unregistered():
    token = secrets.token_hex(8)
    recovery = InPlaceRecovery(RecoverySettings("in-place", 5.0), token, emit=lambda *a, **k: None)
    dying, live = start(token, 1.0), start(token, 60.0)
    try:
        group = Group(slots=[Slot(local_rank=0, process=Process(dying)), Slot(local_rank=1, process=Process(live))])
        recovery.server.expect({0: dying.pid, 1: live.pid})
        for popen in (dying, live):
            assert popen.stdout.readline().strip() == "registered"
        deadline = time.monotonic() + 10
        while recovery.server.link(0) is None or recovery.server.link(1) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        dying.stdin.write("close\n")
        dying.stdin.flush()
        while recovery.server.link(0) is not None:  # the hang-up is read; the process lingers
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert recovery.server.hung_up(0, dying.pid) and dying.poll() is None
        assert recovery.blocker(group, restarts_left=1) is None  # waited for its exit
        assert dying.poll() is not None
    finally:
        for popen in (dying, live):
            popen.kill()
            popen.wait()
        recovery.close()


def test_a_worker_that_never_registered_still_blocks_at_once():
    token = secrets.token_hex(8)
    recovery = InPlaceRecovery(RecoverySettings("in-place", 5.0), token, emit=lambda *a, **k: None)
    live = start(token, 60.0)
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        group = Group(slots=[Slot(local_rank=0, process=Process(silent)), Slot(local_rank=1, process=Process(live))])
        recovery.server.expect({0: silent.pid, 1: live.pid})
        assert live.stdout.readline().strip() == "registered"
        started = time.monotonic()
        why = recovery.blocker(group, restarts_left=1)
        assert why == f"local rank 0 (pid {silent.pid}) did not register with launcher.recoverable"
        assert time.monotonic() - started < 1.0
    finally:
        for popen in (silent, live):
            popen.kill()
            popen.wait()
        recovery.close()
