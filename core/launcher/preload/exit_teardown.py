"""Tearing down a gloo process group that a worker's code left alive, before its interpreter shuts down.

Where launcher's own code runs the worker's code (``--run-path`` and any function entrypoint), a
script that ends without ``destroy_process_group()`` would otherwise race gloo against interpreter
shutdown: a gloo worker thread drops its last reference to a finished collective (and so to a
tensor that has a Python object) a moment after the collective returned; if the main thread has
begun finalising by then, that thread cannot take the GIL, CPython ends it with ``pthread_exit``,
and unwinding through the C++ destructor calls ``std::terminate``: SIGABRT, "terminate called
without an active exception", after the script's last output.

:func:`arm` registers :func:`destroy_leftover_gloo_groups` with :mod:`atexit` *before* the
worker's code runs: handlers run last-registered first, so the script's own exit handlers (which
may still use the group, or destroy it themselves) run before it, and it runs before the
interpreter starts finalising. It only destroys what is left, only when every backend of the
default group is gloo (NCCL's teardown waits on the device and on peers; it is not touched here),
and never raises: the worker's outcome is its code's.
"""

from __future__ import annotations

import sys


def destroy_leftover_gloo_groups() -> bool:
    """Destroy every process group if the default one is still initialised and gloo-only; whether it did."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:  # the worker never imported torch.distributed: nothing to tear down
        return False
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return False
        # "gloo", or per device "cpu:gloo,cuda:gloo"; anything with another backend is left alone.
        backends = [item.rpartition(":")[2].strip() for item in str(dist.get_backend()).split(",")]
        if any(backend != "gloo" for backend in backends):
            return False
        # Joins gloo's worker threads with the GIL released, so their last references drop
        # while the interpreter can still take them.
        dist.destroy_process_group()
        return True
    except Exception:  # noqa: BLE001 - the process is exiting; its own code's outcome stands
        return False


def arm() -> None:
    """Run :func:`destroy_leftover_gloo_groups` at exit, after the exit handlers the worker's code registers."""
    import atexit

    atexit.register(destroy_leftover_gloo_groups)
