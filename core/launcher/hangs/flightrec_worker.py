"""The worker's side of the flight-recorder dump at a hang (``--hang-timeout``).

PyTorch's flight recorder keeps the last collectives each process group entered, in the worker.
Only the worker can read it (``torch._C._distributed_c10d._dump_fr_trace_json``), and a worker
hung in a collective never runs a Python signal handler (the main thread is inside C++). So the
start-up hook starts :func:`serve`: a daemon thread blocked in ``open()`` on a named pipe the agent
made (``LAUNCHER_FR_REQUEST``); no CPU, no GIL, until the agent writes a byte to it. The thread
then dumps the record, adds the membership of each process group (gloo's record has none), and
writes it to ``LAUNCHER_FR_FILE`` in one rename, so the agent never reads half a dump.

Loaded by path from ``launcher/hangs/_site/sitecustomize.py`` and by launcher's own worker
bootstraps: standard library only, and nothing newer than Python 3.8 (see that file). torch is
never imported here: a worker that has not imported ``torch.distributed`` has no record.
"""

import json
import os
import sys
import threading

REQUEST_ENV = "LAUNCHER_FR_REQUEST"
FILE_ENV = "LAUNCHER_FR_FILE"
#: Written to the old pipe by :func:`serve` to move the thread to a new one.
_MOVE = b"move"


def _process_groups(dist):
    """``{group name: [global ranks]}`` of every process group this worker knows."""
    world = getattr(dist.distributed_c10d, "_world", None)
    names = dict(getattr(world, "pg_names", {}) or {})
    members = dict(getattr(world, "pg_group_ranks", {}) or {})
    groups = {}
    for group, name in names.items():
        ranks = members.get(group)
        if ranks:
            groups[str(name)] = sorted(int(rank) for rank in ranks)
    return groups


def dump():
    """This worker's flight record as a dict (``launcher_note`` says why when there is none)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return {"launcher_note": "torch.distributed was never imported"}
    if not dist.is_available() or not dist.is_initialized():
        return {"launcher_note": "no process group initialised"}
    import importlib

    c10d = importlib.import_module("torch._C._distributed_c10d")  # loaded already, with torch.distributed
    raw = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    data = json.loads(raw)
    data["launcher_rank"] = dist.get_rank()
    data["launcher_world_size"] = dist.get_world_size()
    try:
        data["launcher_pg_ranks"] = _process_groups(dist)
    except Exception as exc:  # private torch state: the record stands without it
        data["launcher_pg_ranks_error"] = str(exc)
    return data


def _write(path, data):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, separators=(",", ":"))
    os.replace(tmp, path)


def _serve(state):
    while True:
        request = state["request"]
        try:
            # Blocks (without the GIL) until the agent opens the pipe to write.
            fd = os.open(request, os.O_RDONLY)
            try:
                data = os.read(fd, 64)
            finally:
                os.close(fd)
        except OSError:
            return  # the pipe is gone: the agent is gone
        if data == _MOVE or request != state["request"]:
            continue  # a new attempt's pipe (recovery in place): wait on that one
        try:
            record = dump()
        except Exception as exc:  # say why, rather than leave the agent waiting
            record = {"launcher_note": f"cannot dump the flight record: {type(exc).__name__}: {exc}"}
        try:
            _write(state["out"], record)
        except OSError:  # noqa: SIM105 - no contextlib import in every worker for this
            continue


def serve(environ=None):
    """Start the dump thread when the agent asked for it (``LAUNCHER_FR_REQUEST`` in ``environ``,
    by default this process's environment); once per process. Called again with another
    attempt's pipe (a worker that recovered in place), the thread moves to it."""
    environ = os.environ if environ is None else environ
    request = environ.get(REQUEST_ENV)
    out = environ.get(FILE_ENV)
    if not request or not out:
        return
    state = sys.__dict__.get("_launcher_fr_state")
    if state is not None:
        old = state["request"]
        if old == request:
            state["out"] = out
            return
        state["request"], state["out"] = request, out
        try:  # wake the thread from the old pipe
            fd = os.open(old, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, _MOVE)
            finally:
                os.close(fd)
        except OSError:
            pass
        return
    state = {"request": request, "out": out}
    # In sys, not here: this file is loaded under two names (the start-up hook's, launcher's).
    sys.__dict__["_launcher_fr_state"] = state
    thread = threading.Thread(target=_serve, args=(state,), name="launcher-flight-recorder", daemon=True)
    thread.start()
