"""Releasing a worker's main thread that is blocked inside a collective, from another thread.

Aborting torch.distributed's process groups (``_abort_process_group``) is what releases an NCCL
collective in progress. A gloo collective in progress is not released by it: in torch 2.13
``ProcessGroupGloo.abort()`` from another thread neither ends the wait in progress nor closes
its connections (measured: the wait ends only when a peer process dies). When every rank sits in
such a wait (mismatched collectives, a deadlock, a hang that ends in a recovery), nothing else
would ever release them. What does: shutting down the TCP connections that the rank's process
group opened. Gloo then sees its pairs closed, exactly as when a peer dies, fails the wait with
its usual "Connection closed by peer" error, and the peers' waits on this rank fail the same way.

Which connections: those this process opened while inside the training function (the process
groups are made there, and everything made there is rebuilt on the next call), connected ones
only (shutting down a listening socket would make gloo's device thread fail its ``accept``).
Sockets that existed when the function was called (a logger's, a data service's) are never
touched. Only done when the main thread has made no progress (same frame, same instruction)
for a while after being told to leave: one blocked in C.

Standard library only (training code imports it through :func:`launcher.recoverable`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import Any

__all__ = ["position", "shutdown_new_connections", "socket_inodes"]

_FD_DIR = "/proc/self/fd"


def socket_inodes() -> frozenset[str]:
    """The sockets this process has open now (``socket:[inode]``, as ``/proc/self/fd`` names them)."""
    found = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(_FD_DIR):
            with contextlib.suppress(OSError):
                link = os.readlink(f"{_FD_DIR}/{name}")
                if link.startswith("socket:"):
                    found.add(link)
    return frozenset(found)


def shutdown_new_connections(before: frozenset[str]) -> int:
    """Shut down (both ways) every connected TCP socket of this process that is not in ``before``;
    how many. The descriptors stay open: their owners (gloo) see the connection end and close them."""
    count = 0
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return 0
    for name in names:
        try:
            fd = int(name)
            if os.readlink(f"{_FD_DIR}/{name}") in before:
                continue
            copy = os.dup(fd)  # a descriptor of our own: the original may be closed meanwhile
        except (OSError, ValueError):
            continue
        try:
            link = os.readlink(f"{_FD_DIR}/{copy}")
        except OSError:
            os.close(copy)
            continue
        if not link.startswith("socket:") or link in before:
            os.close(copy)
            continue
        try:
            sock = socket.socket(fileno=copy)  # owns ``copy``: closing it leaves the original open
        except OSError:
            os.close(copy)
            continue
        with sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                continue
            try:
                sock.getpeername()  # a listening socket has no peer: leave it alone
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                continue
            count += 1
    return count


def position(thread_id: int | None) -> tuple[Any, ...] | None:
    """Where thread ``thread_id`` is in Python now (its innermost frame and instruction); the same
    value twice, some time apart, means it has been inside one C call all along."""
    if thread_id is None:
        return None
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return None
    return id(frame), frame.f_code, frame.f_lasti
