"""The worker's side of recovery in place: :func:`recoverable`.

Under launcher each worker can reach its agent's control socket, named after the job's token in
its environment (:func:`launcher.recovery.socket_address`). Calling a function wrapped by
:func:`recoverable` registers this process with the agent (which checks, by the kernel's word,
that it is the worker it started), then runs the function. When the job must recover (this
rank raised, or the agent says so because another rank failed, hung or was lost), the function
is left, torch.distributed is torn down if the script imported it, the process waits for the new
round's environment, writes it into :data:`os.environ` and calls the function again: same
process, same modules, same memory.

Outside launcher (torchrun, plain ``python``), with ``--recovery restart``, or in a process that
is not the worker itself (a data-loader worker, a spawned child), the wrapper calls the function
once and nothing else.

Messages are JSON lines over one Unix stream socket per process::

    worker -> agent   {"op": "register"}   answered {"op": "ok"} or {"op": "no"}
                      {"op": "raised", "error": "ValueError: ...", "traceback": "..."}
                      {"op": "left"}    the function was left (after "recover", or after "raised")
                      {"op": "done"}    the function returned
    agent -> worker   {"op": "recover"} leave the function now
                      {"op": "resume", "env": {...}}   call it again with these variables
                      {"op": "exit"}    no recovery: raise the function's exception (or exit 1)

Standard library only: training code imports it without torch and without the agent.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from launcher.recovery import own_token, release, socket_address

__all__ = ["RecoveryInterrupt", "recoverable"]


F = TypeVar("F", bound=Callable[..., Any])

#: Seconds without progress (same frame, same instruction) after which a main thread told to leave
#: is taken as blocked in C, and its function's connections are shut down (launcher.recovery.release).
STUCK_AFTER = 1.0


class RecoveryInterrupt(BaseException):  # noqa: N818 - raised into the function, like KeyboardInterrupt
    """Raised in the main thread to make it leave the function for a recovery.

    A :class:`BaseException`, so that ``except Exception`` in training code does not swallow it.
    """


class _Exit(Exception):  # noqa: N818
    """The agent ends this worker (no recovery, or the agent is gone)."""


def teardown_distributed() -> None:
    """Abort and forget every torch.distributed process group, if torch.distributed is in use.

    Aborting (not destroying) is what releases a thread blocked in a collective: NCCL
    communicators are aborted, gloo's pairs are closed, so the peers' collectives fail at once
    instead of waiting for their timeout. Never imports torch itself.

    The groups are forgotten at once (a new ``init_process_group`` works as soon as this
    returns), and their aborts run on a daemon thread that nothing waits for: NCCL's abort
    (``ncclCommAbort``) sets its abort flag first, which is what releases the kernels and the
    peers, then tears the communicator down; waiting for all of it is the only NCCL-only step
    of a recovery, which took a second more on one H100 than over gloo (``docs/recovery.md``).
    Where this torch lacks the internals that forgetting needs, the abort is done here and
    waited for, as ``_abort_process_group()`` does.
    """
    with _teardown_lock:
        _teardown()


_teardown_lock = threading.Lock()
#: The attributes of torch's ``_World`` that ``_abort_process_group()`` clears (torch 2.13; a torch
#: without one of them gets the waited-for abort).
_WORLD_MAPS = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag", "tags_to_pg",
               "pg_coalesce_state")


def _teardown() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    forgotten = _forget_groups(c10d)
    if forgotten is not None:
        # A daemon, that only the process's exit waits for, and not for long (_finish_aborts).
        thread = threading.Thread(target=_abort_groups, args=(c10d, *forgotten), name="launcher-recovery-abort",
                                  daemon=True)
        global _exit_waits
        if not _exit_waits:  # at the first abort: run before the exit handlers of what is imported by now (torch)
            atexit.register(_finish_aborts)
            _exit_waits = True
        _aborting[:] = [t for t in _aborting if t.is_alive()] + [thread]
        thread.start()
        return
    abort = getattr(c10d, "_abort_process_group", None)
    try:
        if abort is not None:
            abort()
        else:  # older torch: destroy is the most there is
            dist.destroy_process_group()
    except Exception as exc:  # a half-broken group: forget it anyway, a new one is made next round
        sys.stderr.write(f"launcher: tearing down torch.distributed: {type(exc).__name__}: {exc}\n")
        with contextlib.suppress(Exception):  # nothing more to release
            dist.destroy_process_group()


#: Aborts still running on their daemon threads (:func:`_finish_aborts`).
_aborting: list[threading.Thread] = []
_exit_waits = False  # whether _finish_aborts is registered to run at exit
#: Seconds a process that ends waits for the aborts still running (NCCL's took about a second).
ABORT_EXIT_WAIT = 10.0


def _finish_aborts() -> None:
    """At the process's exit: wait (bounded) for the old groups' aborts still running. Left in C++
    while the interpreter and the C++ runtime tear down around them, they killed the process
    (``terminate called without an active exception``, SIGABRT) after a successful run."""
    deadline = time.monotonic() + ABORT_EXIT_WAIT
    for thread in _aborting:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            sys.stderr.write(f"launcher: the process groups aborted by the recovery were still being torn down "
                             f"{ABORT_EXIT_WAIT:g} s later; exiting without waiting for them\n")
            return


def _forget_groups(c10d: Any) -> tuple[list[Any], Any] | None:
    """Take every process group out of torch.distributed's bookkeeping, as
    ``_abort_process_group()`` does after its aborts; ``(the groups, newest first, the default
    group)`` for :func:`_abort_groups`, or ``None`` (nothing changed) where this torch keeps them
    otherwise."""
    world = getattr(c10d, "_world", None)
    update = getattr(c10d, "_update_default_pg", None)
    unregister = getattr(c10d, "_unregister_all_process_groups", None)
    member = getattr(c10d, "GroupMember", None)
    if world is None or update is None or unregister is None or member is None \
            or not all(hasattr(world, name) for name in _WORLD_MAPS):
        return None
    names = world.pg_names
    groups = sorted(names, key=lambda group: names[group], reverse=True)  # the order torch aborts them in
    default = getattr(member, "WORLD", None)
    update(None)
    for name in _WORLD_MAPS:
        getattr(world, name).clear()
    unregister()
    # Groups made after a recovery get the names the first ones had (torch does the same).
    world.group_count = 0
    return groups, default


def _abort_groups(c10d: Any, groups: list[Any], default: Any) -> None:
    """Abort ``groups`` (newest first), inside one NCCL group call when the default group has an
    NCCL backend, so that aborting several communicators cannot deadlock (as torch does)."""
    nccl = None
    try:
        torch = sys.modules["torch"]
        kind = getattr(c10d, "ProcessGroupNCCL", None)
        if default is not None and kind is not None and c10d.is_nccl_available():
            with contextlib.suppress(RuntimeError):  # no CUDA backend in this group
                backend = default._get_backend(torch.device("cuda"))
                nccl = backend if isinstance(backend, kind) else None
        if nccl is not None:
            nccl._group_start()
        for group in groups:
            group.abort()
        if nccl is not None:
            nccl._group_end()
    except Exception as exc:  # the groups are forgotten already: the next round makes new ones
        sys.stderr.write(f"launcher: aborting torch.distributed's process groups: {type(exc).__name__}: {exc}\n")


class _Channel:
    """This process's connection to the agent, and the thread that listens on it."""

    def __init__(self, address: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(address)
        except OSError:
            self._sock.close()
            raise
        self._file = self._sock.makefile("rb")
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._messages: list[dict[str, Any]] = []
        self._closed = False
        #: The main thread is inside the function (a recovery must interrupt it).
        self._inside = False
        self._interrupted = False
        self._main = threading.main_thread().ident
        #: Counts the calls of the function (a release watch ends with its call).
        self._call = 0
        #: The sockets open when the function was last called: never shut down by a release.
        self._sockets_before: frozenset[str] = frozenset()
        self.send({"op": "register"})
        reply = self._read()
        self.accepted = reply is not None and reply.get("op") == "ok"
        if self.accepted:
            threading.Thread(target=self._listen, name="launcher-recovery", daemon=True).start()

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._send_lock, contextlib.suppress(OSError):  # the agent is gone: the next wait says so
            self._sock.sendall(data)

    def _read(self) -> dict[str, Any] | None:
        try:
            line = self._file.readline()
        except OSError:
            return None
        if not line:
            return None
        result: dict[str, Any] = json.loads(line)
        return result

    def _listen(self) -> None:
        while True:
            message = self._read()
            if message is not None and message.get("op") == "recover":
                self._interrupt()
            with self._cond:
                if message is None:
                    self._closed = True
                else:
                    self._messages.append(message)
                self._cond.notify_all()
            if message is None:
                return

    def _interrupt(self) -> None:
        # Release the main thread first (a collective blocked on a peer returns with an error),
        # then make it leave the function at its next bytecode.
        teardown_distributed()
        with self._cond:
            if self._inside and not self._interrupted and self._main is not None:
                self._interrupted = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._main),
                                                           ctypes.py_object(RecoveryInterrupt))
                threading.Thread(target=self._release_when_stuck, args=(self._call,),
                                 name="launcher-recovery-release", daemon=True).start()

    def _release_when_stuck(self, call: int) -> None:
        """While the main thread has not left call ``call`` of the function: whenever it made no
        progress for :data:`STUCK_AFTER` seconds (blocked in C: a gloo collective that the abort did
        not end), shut down the connections opened inside the function (launcher.recovery.release)."""
        last = release.position(self._main)
        released_at = None
        while True:
            time.sleep(STUCK_AFTER)
            with self._cond:
                if not self._inside or self._call != call:
                    return
                before = self._sockets_before
            now = release.position(self._main)
            if now is not None and now == last and now != released_at:
                released_at = now
                count = release.shutdown_new_connections(before)
                if count:
                    sys.stderr.write(f"launcher: recoverable: the main thread was blocked for {STUCK_AFTER:g}s after "
                                     f"the process groups were aborted; shut down {count} connection(s) it opened\n")
            last = now

    def enter(self) -> None:
        sockets = release.socket_inodes()
        with self._cond:
            self._inside = True
            self._interrupted = False
            self._call += 1
            self._sockets_before = sockets

    def leave(self) -> None:
        """The main thread left the function: a pending interrupt must not fire outside it."""
        while True:
            try:
                with self._cond:
                    self._inside = False
                    if self._interrupted:  # cancel it if it has not been raised yet
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._main or 0), None)
                        self._interrupted = False
                return
            except RecoveryInterrupt:
                continue  # raised while leaving: it has done its job

    def wait_for(self, *ops: str) -> dict[str, Any]:
        """The next message among ``ops`` (others are dropped); :class:`_Exit` if the agent is gone."""
        with self._cond:
            while True:
                while self._messages:
                    message = self._messages.pop(0)
                    if message.get("op") in ops:
                        return message
                if self._closed:
                    raise _Exit("the agent closed the recovery channel")
                self._cond.wait()

    def recover_requested(self) -> bool:
        with self._cond:
            return any(m.get("op") == "recover" for m in self._messages)


_channel: _Channel | None = None
_channel_checked = False


def _connect() -> _Channel | None:
    """This process's channel, made once; ``None`` outside launcher, with ``--recovery restart``
    (nothing listens), or in a process the agent did not start as a worker."""
    global _channel, _channel_checked
    if _channel_checked:
        return _channel
    _channel_checked = True
    token = own_token()
    if not token:
        return None
    try:
        channel = _Channel(socket_address(token))
    except (ConnectionRefusedError, FileNotFoundError):
        return None  # the agent runs with --recovery restart
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"launcher: recoverable: cannot reach the agent ({exc}); running without recovery\n")
        return None
    _channel = channel if channel.accepted else None
    return _channel


def _forget_in_child() -> None:
    global _channel, _channel_checked
    if _channel_checked:  # a child of a process that looked (a worker's data loader): never on its own
        _channel, _channel_checked = None, True
    # Else the parent never looked: the agent itself, whose Python API forks function workers
    # (start_method="fork") after importing the wrapped function. The child looks for itself,
    # and the agent accepts it only if it is the worker it started (SO_PEERCRED).


os.register_at_fork(after_in_child=_forget_in_child)


_NOTHING = object()


def _run(channel: _Channel, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    while True:
        error: BaseException | None = None
        result: Any = _NOTHING
        channel.enter()
        try:
            result = fn(*args, **kwargs)
        except RecoveryInterrupt:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported to the agent, raised again unless it recovers
            error = exc
        finally:
            channel.leave()
        if result is not _NOTHING and not channel.recover_requested():
            channel.send({"op": "done"})
            return result
        if error is not None and not channel.recover_requested():
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise error  # a signal or an exit: the agent sees the process end
            text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            sys.stderr.write(text)
            sys.stderr.flush()
            # Said before the teardown, whose broken collectives make the peers report too: the
            # agent names the earliest report as the root cause.
            channel.send({"op": "raised", "error": f"{type(error).__name__}: {error}", "traceback": text})
            teardown_distributed()  # peers blocked on this rank fail at once
            try:
                message = channel.wait_for("recover", "exit")
            except _Exit:
                message = {"op": "exit"}
            if message.get("op") == "exit":
                raise error
        else:
            teardown_distributed()
        del error
        channel.send({"op": "left"})
        try:
            message = channel.wait_for("resume", "exit")
        except _Exit:
            message = {"op": "exit"}
        if message.get("op") == "exit":
            raise SystemExit(1)
        changed = message.get("env", {})
        os.environ.update(changed)
        _follow_hang_watch(changed)


def _follow_hang_watch(changed: dict[str, str]) -> None:
    """With ``--hang-timeout``, each attempt has its own heartbeat file and stacks files: beat into
    and dump stacks to the new attempt's (what a fresh worker's start-up does)."""
    heartbeat = sys.modules.get("launcher.hangs.heartbeat")
    if heartbeat is not None and "LAUNCHER_HEARTBEAT_FILE" in changed:
        heartbeat._forget_in_child()  # drops the old mapping: the next beat maps the new slot
    # The start-up hook's progress (optimizer steps, collectives: launcher/stragglers/timing.py,
    # loaded under this name) writes to the same slots: without this, a job with no launcher
    # call beat into the old attempt's file, and looked silent from the recovery on.
    timing = sys.modules.get("_launcher_straggler_timing")
    if timing is not None and ("LAUNCHER_HEARTBEAT_FILE" in changed or "LAUNCHER_STRAGGLER_FILE" in changed):
        timing.follow_new_attempt()
    if "LAUNCHER_STACKS_FILE" in changed:
        from launcher.hangs import stacks

        os.environ.pop(stacks.STACKS_ARMED_ENV, None)
        stacks.arm_here(os.environ)


def recoverable(fn: F) -> F:
    """Make ``fn`` (the training function) recover in place under launcher.

    ::

        @launcher.recoverable
        def train():
            torch.distributed.init_process_group("gloo")
            ...

    Under launcher, when the job must recover, every healthy rank leaves ``fn``, its process
    groups are aborted, and ``fn`` is called again in the same process with the new round's
    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RESTART_COUNT``...
    in :data:`os.environ`. State kept outside ``fn`` (a model, an in-memory checkpoint) is kept.
    Outside launcher it calls ``fn`` once, nothing more.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        channel = _connect()
        if channel is None:
            return fn(*args, **kwargs)
        return _run(channel, fn, args, kwargs)

    return wrapper  # type: ignore[return-value]
