"""A store server out of file descriptors pauses accepting and says so once, not ten times a second."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

from tests.conftest import launcher_env

SERVER = textwrap.dedent(
    """
    import logging, os, resource, sys, time
    from launcher.store.server import StoreServer

    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    server = StoreServer("127.0.0.1", 0).start()
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    hoard = []
    try:
        while True:
            hoard.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    print(server.port, flush=True)
    time.sleep(float(sys.argv[1]))
    """
)


def test_emfile_in_the_accept_loop_warns_once_per_interval() -> None:
    seconds = 3.0
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(seconds)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=launcher_env())
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        # A connection the server cannot accept: the kernel completes it, accept() fails with EMFILE.
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            deadline = time.monotonic() + 60
            _, stderr = server.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        server.kill()
        server.wait()
    warnings = [line for line in stderr.splitlines() if "cannot accept connections" in line]
    # Retried every 0.1 s for 3 s: about 30 failures, one warning.
    assert len(warnings) == 1, stderr
    assert "Too many open files" in warnings[0]
