"""launcher.recovery.release on real sockets: only the connections opened since the snapshot are
shut down; older ones and listening ones are left alone."""

from __future__ import annotations

import socket
import threading
import time

from launcher.recovery import release


def connected_pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(listener.getsockname()[:2], timeout=10)
    server, _ = listener.accept()
    return client, server


def test_only_connections_opened_since_the_snapshot_are_shut_down():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        old_client, old_server = connected_pair(listener)
        before = release.socket_inodes()
        new_client, new_server = connected_pair(listener)
        new_listener = socket.create_server(("127.0.0.1", 0))
        sockets = (old_client, old_server, new_client, new_server, new_listener)
        try:
            # A thread blocked in recv on the new connection is released (what gloo's wait needs).
            got: list[bytes] = []
            reader = threading.Thread(target=lambda: got.append(new_client.recv(10)))
            reader.start()
            time.sleep(0.1)
            assert release.shutdown_new_connections(before) == 2  # both ends of the new pair
            reader.join(10)
            assert not reader.is_alive() and got == [b""]
            old_client.sendall(b"still")  # the old connection works
            assert old_server.recv(10) == b"still"
            late_client, late_server = connected_pair(new_listener)  # the listener still accepts
            late_client.close()
            late_server.close()
            assert all(s.fileno() >= 0 for s in sockets)  # nothing closed under its owner
        finally:
            for s in sockets:
                s.close()


def test_position_is_stable_only_while_a_thread_sits_in_one_call():
    ready, stop = threading.Event(), threading.Event()

    def blocked() -> None:
        ready.set()
        stop.wait()  # one C-level wait

    thread = threading.Thread(target=blocked)
    thread.start()
    ready.wait(10)
    time.sleep(0.05)
    first = release.position(thread.ident)
    time.sleep(0.05)
    assert first is not None and release.position(thread.ident) == first
    stop.set()
    thread.join(10)
    assert release.position(thread.ident) is None
