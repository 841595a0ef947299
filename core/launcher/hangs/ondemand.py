"""Stacks on demand: ``SIGUSR2`` to a running agent, and the ``launcher stacks`` command.

With ``--hang-timeout`` the agent dumps every local rank's stacks on ``SIGUSR2`` (see
:meth:`launcher.hangs.monitor.HangMonitor.enable_dump_signal`) and writes :data:`AGENT_FILE` into
its run log directory, so ``launcher stacks LOGDIR`` finds it. Without ``--hang-timeout`` the
workers are not armed (arming costs every worker a few milliseconds of start-up and changes its
environment): ``SIGUSR2`` then only makes the agent say so (:func:`explain_dump_signal`), instead
of killing it as the signal's default action would.

``launcher stacks`` sends ``SIGUSR2`` only to a launcher agent (recorded in a log directory with
its start time, or a process running ``launcher``) that catches it (``SigCgt`` in
``/proc/PID/status``): the signal's default action would kill any other process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from launcher.errors import UsageError

#: Sent to the agent: every local rank's stacks, now (the job goes on).
DUMP_SIGNAL = signal.SIGUSR2
#: Written by an agent that dumps on :data:`DUMP_SIGNAL`, in its run log directory.
AGENT_FILE = "agent.json"
#: How long ``launcher stacks`` waits for a report, by default.
DEFAULT_WAIT = 20.0

NO_STACKS_HINT = (
    "launcher: no stacks: this job was started without --hang-timeout, so its workers cannot dump them; "
    "to get every rank's stacks on SIGUSR2 (or with `launcher stacks`), start the job with "
    "--hang-timeout SECONDS (ranks that never call launcher.heartbeat() are then never called hung, "
    "only dumped on demand)\n"
)

USAGE = "usage: launcher stacks PID|LOGDIR [--wait SECONDS]"


def explain_dump_signal(forwarded: Sequence[int]) -> Callable[[], None]:
    """Without ``--hang-timeout``: catch :data:`DUMP_SIGNAL` and print :data:`NO_STACKS_HINT`.

    Not when the signal is forwarded to the workers (``--signals-to-handle``), nor off the main
    thread. Returns what restores the previous handler.
    """
    if DUMP_SIGNAL in forwarded or threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_dump_signal(_signum: int, _frame: Any) -> None:
        # One write(2): atomic, and safe wherever the main thread was (no buffer, no lock).
        with contextlib.suppress(OSError):
            os.write(2, NO_STACKS_HINT.encode())

    try:
        previous = signal.signal(DUMP_SIGNAL, on_dump_signal)
    except (OSError, ValueError):
        return lambda: None

    def restore() -> None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            signal.signal(DUMP_SIGNAL, previous)

    return restore


# -- the agent's file ---------------------------------------------------------------------------


def start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), ``None`` if it is gone.

    With the pid, it names one process: a pid reused after the agent ended has another.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def catches(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (else the signal would likely kill it)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _watching(pid: int) -> bool:
    """Whether ``pid`` maps a hang monitor's heartbeat file read-only, as an agent with
    ``--hang-timeout`` does (its workers map their slots read-write)."""
    try:
        with open(f"/proc/{pid}/maps") as handle:
            for line in handle:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[1].startswith("r-") and "/launcher_hangs_" in fields[5]:
                    return True
    except OSError:
        pass
    return False


def forwards_dump_signal(pid: int) -> bool:
    """Whether the agent ``pid`` was told to forward :data:`DUMP_SIGNAL` to its workers
    (``--signals-to-handle`` on its command line, or ``PET_SIGNALS_TO_HANDLE``)."""
    values = []
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = [arg.decode("utf-8", "replace") for arg in handle.read().split(b"\0")]
    except OSError:
        argv = []
    for index, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        if flag in ("--signals-to-handle", "--signals_to_handle"):
            values.append(value if equals else (argv[index + 1] if index + 1 < len(argv) else ""))
    if not values:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as handle:
            for item in handle.read().split(b"\0"):
                if item.startswith(b"PET_SIGNALS_TO_HANDLE="):
                    values.append(item.partition(b"=")[2].decode("utf-8", "replace"))
    name = DUMP_SIGNAL.name
    return any(item.strip().upper() in (name, name[3:]) for value in values for item in value.split(","))


def looks_like_agent(pid: int) -> bool:
    """Whether ``pid`` runs launcher: ``launcher ...`` or ``python -m launcher ...``, or it maps a
    hang monitor's heartbeat file (an agent started through the Python API)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = [arg.decode("utf-8", "replace") for arg in handle.read().split(b"\0")]
    except OSError:
        return False
    if any(os.path.basename(arg) == "launcher" for arg in argv[:2]):
        return True
    for index, arg in enumerate(argv[1:-1], start=1):
        if not arg.startswith("-"):
            break  # the script: what follows are its arguments
        if arg == "-m":
            return argv[index + 1] == "launcher"
    return _watching(pid)


def write_agent_file(directory: str, *, node: str, run_id: str) -> str:
    """Record this agent in ``directory`` for ``launcher stacks``; the file's path."""
    import json  # here and below: every launch imports this module, few get this far

    path = os.path.join(directory, AGENT_FILE)
    data = {"pid": os.getpid(), "start_time": start_time(os.getpid()), "node": node, "run_id": run_id,
            "signal": int(DUMP_SIGNAL)}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)
    return path


def _live_agent(path: str) -> dict[str, Any] | None:
    """The record in ``path`` if its agent still runs (same pid and start time), else ``None``."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        pid = int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid <= 0 or start_time(pid) is None or start_time(pid) != data.get("start_time"):
        return None
    data["pid"] = pid
    data["dir"] = os.path.dirname(os.path.abspath(path))
    return dict(data)


def find_agents(path: str) -> list[dict[str, Any]]:
    """The running agents recorded in ``path`` (a run log directory) or in its subdirectories
    (a ``--log-dir`` shared by several jobs or agents)."""
    import glob

    own = os.path.join(path, AGENT_FILE)
    candidates = [own] if os.path.exists(own) else sorted(glob.glob(os.path.join(glob.escape(path), "*", AGENT_FILE)))
    return [agent for agent in map(_live_agent, candidates) if agent is not None]


# -- launcher stacks ----------------------------------------------------------------------------


def _stacks_files(directory: str) -> set[str]:
    import glob

    return set(glob.glob(os.path.join(glob.escape(directory), "stacks_attempt_*.txt")))


def _report_part(path: str) -> str:
    """The report at the head of a stacks file (the full stacks follow it)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    head, _, _ = text.partition("\n\nFull stacks of the ranks on ")
    return head


def _signal(pid: int, *, checked: bool = False) -> None:
    """Send :data:`DUMP_SIGNAL` to the agent ``pid`` (``checked``: known from its agent file)."""
    if not checked and not looks_like_agent(pid):
        raise UsageError(
            f"launcher stacks: process {pid} is not a launcher agent (or is gone); nothing was sent: give the "
            "agent's pid, or its run log directory"
        )
    if not checked and forwards_dump_signal(pid):
        raise UsageError(
            f"launcher stacks: the agent with pid {pid} forwards SIGUSR2 to its workers (--signals-to-handle); "
            "nothing was sent"
        )
    if not catches(pid, DUMP_SIGNAL):
        raise UsageError(
            f"launcher stacks: the agent with pid {pid} does not handle SIGUSR2 (started off the main thread, or "
            "with SIGUSR2 in --signals-to-handle); nothing was sent"
        )
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError as exc:
        raise UsageError(f"launcher stacks: cannot signal process {pid}: {exc.strerror or exc}") from None


def stacks_command(argv: Sequence[str]) -> int:
    """``launcher stacks PID|LOGDIR [--wait SECONDS]``: every rank's stacks from a running job.

    With a run log directory (or a ``--log-dir`` holding several), each running agent recorded
    there is sent ``SIGUSR2``; its report is printed here once its stacks file appears (``--wait``
    seconds at most) and the file is named. With a pid, the agent is signalled and the report goes
    to its own stderr and run log directory.
    """
    from launcher.subcommand_args import take_seconds, the_target
    from launcher.values import quote

    args = list(argv)
    wait = take_seconds(args, "--wait", DEFAULT_WAIT, "launcher stacks", USAGE)
    target = the_target(args, "launcher stacks", USAGE)
    if target.isascii() and target.isdigit():
        pid = int(target)
        _signal(pid)
        if _watching(pid):
            print(f"launcher: asked the agent (pid {pid}) for every rank's stacks: the report goes to its stderr, "
                  "and the stacks to stacks_attempt_<attempt>_<n>.txt in its run log directory")
        else:
            print(f"launcher: asked the agent (pid {pid}) for every rank's stacks, but it runs no hang detection "
                  "(--hang-timeout): it can only say so, on its stderr")
        return 0
    if not os.path.isdir(target):
        raise UsageError(f"launcher stacks: {quote(target)} is neither a pid nor a directory; {USAGE}")
    agents = find_agents(target)
    if not agents:
        sys.stderr.write(
            f"launcher: no running launcher agent recorded in {target} (an agent writes {AGENT_FILE} into "
            "its run log directory when started with --hang-timeout)\n"
        )
        return 1
    before = {agent["dir"]: _stacks_files(agent["dir"]) for agent in agents}
    for agent in agents:
        _signal(agent["pid"], checked=True)
    pending = {agent["dir"]: agent for agent in agents}
    deadline = time.monotonic() + wait
    code = 0
    while pending:
        for directory, agent in list(pending.items()):
            new = sorted(_stacks_files(directory) - before[directory], key=os.path.getmtime)
            if new:
                del pending[directory]
                sys.stdout.write(_report_part(new[-1]).rstrip("\n") + "\n")
                print(f"launcher: stacks of every rank of node {agent.get('node')} (agent pid {agent['pid']}): "
                      f"{new[-1]}")
        if not pending:
            break
        if time.monotonic() >= deadline:
            for agent in pending.values():
                sys.stderr.write(
                    f"launcher: no stacks from the agent with pid {agent['pid']} within {wait:g} s (it dumps once "
                    "its workers run: it may be between attempts; its stderr may say more)\n"
                )
            code = 1
            break
        time.sleep(0.1)
    sys.stdout.flush()
    return code
