"""Every worker's Python stacks, taken from outside, with no code in the worker.

How: each worker's interpreter arms :func:`faulthandler.register` at start-up through the
``sitecustomize`` in ``launcher/hangs/_site`` (see its docstring), on :data:`STACKS_SIGNAL`, writing
to a per-rank file. To dump, the agent sends that signal to the armed pid and reads what was
appended. faulthandler writes from the signal handler without taking the GIL, so this works
when the main thread is blocked inside C code (a collective, a read on a dead mount).

Where it does not work, the rank's entry says why and shows what ``/proc`` tells (process state
and kernel wait channel): a ``--no-python`` program that is not Python, an interpreter started
with ``-I``, ``-S`` or ``-E`` (it skips ``sitecustomize``), or a worker that replaced the signal's
handler. A ``--no-python`` script that runs Python (``#!/usr/bin/env python``) is armed as usual.
Function entrypoints (``--run-path`` and the Python API) are armed by the worker bootstrap.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Where a worker writes its stacks, and on which signal.
STACKS_FILE_ENV = "LAUNCHER_STACKS_FILE"
STACKS_SIGNAL_ENV = "LAUNCHER_STACKS_SIGNAL"
#: Set by the armed process, so its descendants do not arm over it.
STACKS_ARMED_ENV = "LAUNCHER_STACKS_ARMED"
#: A real-time signal: programs and libraries leave these alone (SIGUSR1/2 are often taken,
#: e.g. by schedulers' pre-emption notices). Its default action is to terminate, which is why
#: only a pid that recorded itself as armed is ever sent it.
STACKS_SIGNAL = signal.SIGRTMIN + 7 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")

_ARMED = re.compile(rb"^# launcher: stacks armed pid=(\d+) signal=(\d+)$", re.MULTILINE)
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*?)\])? \(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')


@dataclass(frozen=True)
class Frame:
    """One Python frame: file, line, function."""

    file: str
    line: int
    function: str

    def short(self) -> str:
        """``function (file.py:42)``."""
        return f"{self.function} ({os.path.basename(self.file)}:{self.line})"


@dataclass
class ThreadStack:
    """One thread's frames, innermost first, as faulthandler wrote them."""

    ident: str
    frames: list[Frame] = field(default_factory=list)
    current: bool = False

    @property
    def is_main(self) -> bool:
        # faulthandler does not name the main thread; it is the one not started by threading.
        return bool(self.frames) and not (
            self.frames[-1].function == "_bootstrap" and self.frames[-1].file.endswith("threading.py")
        )


@dataclass
class RankStacks:
    """What a dump request got from one worker."""

    local_rank: int
    pid: int | None = None
    threads: list[ThreadStack] = field(default_factory=list)
    #: The raw text faulthandler wrote.
    text: str = ""
    #: Why there are no Python stacks, when there are none.
    note: str = ""
    #: ``/proc`` state and wait channel, e.g. ``S (sleeping), waiting in futex_wait_queue``.
    native: str = ""

    @property
    def main(self) -> ThreadStack | None:
        """The main thread (the first thread when none looks like it)."""
        for thread in self.threads:
            if thread.is_main:
                return thread
        return self.threads[0] if self.threads else None


def arm_environment(env: MutableMapping[str, str], stacks_file: str) -> None:
    """Make a worker started with ``env`` arm stack dumps into ``stacks_file``."""
    env[STACKS_FILE_ENV] = stacks_file
    env[STACKS_SIGNAL_ENV] = str(int(STACKS_SIGNAL))
    env.pop(STACKS_ARMED_ENV, None)
    existing = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = SITE_DIR + (os.pathsep + existing if existing else "")


def arm_here(env: Mapping[str, str]) -> None:
    """Arm this process (a function worker, started by multiprocessing, has no start-up hook)."""
    from launcher.hangs.heartbeat import claim

    claim(force=True)  # this process is the worker: it beats for its rank, its children do not
    _leave_site_path()
    path = env.get(STACKS_FILE_ENV)
    if not path or os.environ.get(STACKS_ARMED_ENV):
        return
    import faulthandler

    handle = open(path, "a")  # noqa: SIM115 - faulthandler writes to it until the process ends
    handle.write(f"# launcher: stacks armed pid={os.getpid()} signal={int(STACKS_SIGNAL)}\n")
    handle.flush()
    faulthandler.register(int(STACKS_SIGNAL), file=handle, all_threads=True, chain=False)
    os.environ[STACKS_ARMED_ENV] = str(os.getpid())
    globals()["_armed_file"] = handle
    from launcher.hangs import flightrec_worker

    flightrec_worker.serve(env)  # the collectives' record, read at a hang (launcher.hangs.flightrec)
    from launcher.stragglers.timing import install

    install()  # completed collectives and optimizer steps are the rank's progress (no code change)


def _leave_site_path() -> None:
    """Take the start-up hook's directory off ``PYTHONPATH``: this process did what the hook does,
    and its children (which the hook would leave alone anyway) should see the paths torchrun gives."""
    if os.environ.get("PYTHONPATH", "").startswith(SITE_DIR):
        rest = os.environ["PYTHONPATH"][len(SITE_DIR) :].lstrip(os.pathsep)
        if rest:
            os.environ["PYTHONPATH"] = rest
        else:
            os.environ.pop("PYTHONPATH", None)


def armed_pid(stacks_file: str) -> int | None:
    """The pid that last armed ``stacks_file`` (``None`` when no process did)."""
    try:
        with open(stacks_file, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    matches = _ARMED.findall(data)
    return int(matches[-1][0]) if matches else None


def native_state(pid: int) -> str:
    """What the kernel says a process is doing: ``S (sleeping), waiting in do_select``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode("ascii", "replace")
    except OSError:
        return "process gone"
    state = stat[stat.rfind(")") + 2 :].split(" ", 1)[0]
    names = {"R": "running", "S": "sleeping", "D": "uninterruptible I/O wait", "T": "stopped",
             "t": "stopped by a debugger", "Z": "zombie"}
    text = f"{state} ({names.get(state, 'state ' + state)})"
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/wchan") as handle:
            wchan = handle.read().strip()
        if wchan and wchan != "0":
            text += f", waiting in {wchan}"
    return text


#: Why a stopped process (state T) shows no stacks and no flight record.
STOPPED_NOTE = "the process is stopped (state T: SIGSTOP, ^Z or a debugger): it cannot answer until continued"


def is_stopped_state(native: str) -> bool:
    """Whether a :func:`native_state` text is that of a stopped process (``T`` or ``t``)."""
    return native[:2] in ("T ", "t ")


def parse_dump(text: str) -> list[ThreadStack]:
    """Threads of one faulthandler dump (``Thread 0x... (most recent call first):`` blocks)."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            threads.append(ThreadStack(ident=head.group(2), current=head.group(1) == "Current thread"))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            number = int(frame.group(2)) if frame.group(2).isdigit() else 0
            threads[-1].frames.append(Frame(frame.group(1), number, frame.group(3).strip()))
    return threads


def collect(targets: Sequence[tuple[int, int, str]], allowed: Mapping[int, set[int]],
            timeout: float = 3.0) -> dict[int, RankStacks]:
    """Dump the stacks of ``targets`` (``(local_rank, worker pid, stacks file)``) at once.

    ``allowed`` maps each local rank to the pids of its worker's process tree: a recorded pid
    outside it (a reused pid) is never signalled. Waits until every dump has stopped growing,
    ``timeout`` seconds at most.
    """
    results: dict[int, RankStacks] = {}
    pending: dict[int, tuple[str, int]] = {}
    for local_rank, worker_pid, path in targets:
        result = RankStacks(local_rank, pid=worker_pid)
        results[local_rank] = result
        pid = armed_pid(path)
        if pid is None or pid not in allowed.get(local_rank, {worker_pid}):
            result.note = (
                "no Python stack: the worker did not arm stack dumps (not a Python program, or "
                "its interpreter skipped sitecustomize: -I, -S or -E)"
                if pid is None else f"no Python stack: pid {pid} that armed dumps is no longer this worker's"
            )
            result.native = native_state(worker_pid)
            continue
        result.pid = pid
        # Before the signal: while it writes its stacks, the process is running, not waiting.
        result.native = native_state(pid)
        if is_stopped_state(result.native):
            # It would write nothing until continued: say so rather than wait out the timeout.
            result.note = f"no Python stack: {STOPPED_NOTE}"
            continue
        try:
            start = os.path.getsize(path)
            os.kill(pid, STACKS_SIGNAL)
        except OSError as exc:
            result.note = f"no Python stack: cannot signal pid {pid}: {exc.strerror or exc}"
            continue
        pending[local_rank] = (path, start)
    deadline = time.monotonic() + timeout
    sizes: dict[int, int] = {}
    stable_since: dict[int, float] = {}
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        now = time.monotonic()
        for local_rank, (path, start) in list(pending.items()):
            try:
                size = os.path.getsize(path)
            except OSError:
                size = start
            if size > start and size == sizes.get(local_rank):
                # A dump is written in one go from a signal handler; a pause means it is done.
                if now - stable_since[local_rank] >= 0.1:
                    results[local_rank].text = _read_from(path, start)
                    del pending[local_rank]
            else:
                sizes[local_rank] = size
                stable_since[local_rank] = now
    for local_rank, (path, start) in pending.items():
        text = _read_from(path, start)
        results[local_rank].text = text
        if not text:
            results[local_rank].note = (
                f"no Python stack within {timeout:.0f} s (the worker replaced the signal's handler, "
                "or is stopped)"
            )
    for result in results.values():
        result.threads = parse_dump(result.text)
    return results


def _read_from(path: str, start: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(start)
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants (for :func:`collect`'s ``allowed``)."""
    from launcher.containment._watchdog_main import descendants

    return {pid} | set(descendants([pid]))


def stack_summary(stacks: RankStacks | None, depth: int = 4) -> str:
    """One line: the main thread's innermost ``depth`` frames, ``f (a.py:1) <- g (b.py:2)``."""
    if stacks is None:
        return "(no stack)"
    main = stacks.main
    if main is None or not main.frames:
        return f"({stacks.note or 'no Python stack'}{'; ' + stacks.native if stacks.native else ''})"
    shown = " <- ".join(frame.short() for frame in main.frames[:depth])
    if len(main.frames) > depth:
        shown += " <- ..."
    return shown


def in_collective(stacks: RankStacks | None) -> bool:
    """Whether the main thread is inside ``torch.distributed`` (a collective, a barrier, a store)."""
    main = stacks.main if stacks is not None else None
    if main is None:
        return False
    return any("/torch/distributed/" in frame.file.replace(os.sep, "/") for frame in main.frames)


def format_threads(stacks: RankStacks) -> str:
    """Every thread of one rank, for the stacks file."""
    if not stacks.threads:
        return f"  {stacks.note or 'no Python stack'}" + (f"\n  process: {stacks.native}" if stacks.native else "")
    lines = []
    if stacks.native:
        lines.append(f"  process: {stacks.native}")
    for thread in stacks.threads:
        label = "main thread" if thread is stacks.main else "thread"
        lines.append(f"  {label} {thread.ident}{' (received the signal)' if thread.current else ''}:")
        lines += [f'    File "{f.file}", line {f.line}, in {f.function}' for f in thread.frames]
    return "\n".join(lines)


def as_json(stacks: RankStacks) -> dict[str, Any]:
    """JSON-able form of one rank's stacks."""
    return {
        "pid": stacks.pid,
        "note": stacks.note or None,
        "native": stacks.native or None,
        "threads": [
            {
                "ident": thread.ident,
                "main": thread is stacks.main,
                "frames": [{"file": f.file, "line": f.line, "function": f.function} for f in thread.frames],
            }
            for thread in stacks.threads
        ],
    }
