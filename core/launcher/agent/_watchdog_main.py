"""The watchdog process: kills the processes of an agent's job once the agent died without cleaning up.

Run as ``python -I -S _watchdog_main.py TOKEN`` (isolated, no site: it starts in milliseconds and
imports nothing of launcher). Every process the job starts carries ``TOKEN`` in its environment
(``LAUNCHER_JOB_TOKEN``, inherited at any depth and in any session), so the job's processes can be
found by scanning ``/proc/*/environ`` without knowing their pids or parents. The agent writes
``+PID`` for each worker it starts (the worker is the leader of its own session), ``-PID`` when it
reaped one, and ``exit`` when it shuts down cleanly. If standard input ends without ``exit``, the
agent is gone: every process carrying the token, in a registered worker's session, or below a
registered worker is SIGKILLed, and the scan repeats until it has found nothing for a while (a
worker the agent was forking when it died execs, and so shows its token, a moment later).

The functions here are also the agent's own tools for its stop-time sweep (``group.py``).
"""

# Annotations are never evaluated: this script imports nothing it does not use (not even typing).
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

#: The worker environment variable holding the job's token (tokens of enclosing jobs too, ':'-joined).
TOKEN_VARIABLE = "LAUNCHER_JOB_TOKEN"


def process_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, session id) of a process, or None if it is gone (a zombie is gone: it cannot be killed)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: parse after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    if fields[0] == b"Z":  # waits for its new parent to reap it, which may take a while
        return None
    return int(fields[1]), int(fields[3])


def descendants(roots: list[int]) -> set[int]:
    """``roots`` and every process below them, by the kernel's children lists (no full scan)."""
    found: set[int] = set()
    pending = list(roots)
    while pending:
        pid = pending.pop()
        if pid in found:
            continue
        found.add(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                    pending.extend(int(child) for child in handle.read().split())
            except OSError:
                pass
    return found


def session_tree(sessions: set[int] | tuple[int, ...]) -> set[int]:
    """Pids in the given sessions, the session leaders, and all their descendants."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = process_stat(int(entry))
            if info is not None:
                table[int(entry)] = info
    doomed = {pid for pid, (_, sid) in table.items() if sid in sessions}
    doomed |= {pid for pid in sessions if pid in table}
    grew = True
    while grew:  # descendants that left the session (setsid daemons) still have a parent link
        grew = False
        for pid, (ppid, _) in table.items():
            if ppid in doomed and pid not in doomed:
                doomed.add(pid)
                grew = True
    doomed.discard(os.getpid())
    return doomed


def job_processes(token: str | bytes, exclude: set[int] | tuple[int, ...] = ()) -> list[int]:
    """Pids whose environment (as it was at exec) holds ``token``; zombies and kernel threads have none."""
    needle = token.encode() if isinstance(token, str) else token
    if not needle:  # an empty token is in every environment: match nothing rather than everything
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                data = handle.read()
        except OSError:  # gone, or not ours to read (another user's process is never the job's)
            continue
        if needle in data:
            found.append(int(entry))
    return found


def kill_job(token: str | bytes, sessions: set[int] | tuple[int, ...] = (), timeout: float = 10.0,
             quiet: float = 0.5) -> None:
    """SIGKILL the job's processes until none has been seen for ``quiet`` seconds (or ``timeout``)."""
    me = {os.getpid()}
    deadline = time.monotonic() + timeout
    last_seen = time.monotonic()
    while time.monotonic() < deadline:
        doomed = set(job_processes(token, me))
        if sessions:
            doomed |= session_tree(sessions)
        doomed -= me
        for pid in doomed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        now = time.monotonic()
        if doomed:
            last_seen = now
        elif now - last_seen >= quiet:
            return
        time.sleep(0.02)


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)  # outlive the agent's own signals to clean up after it
    token = sys.argv[1] if len(sys.argv) > 1 else ""
    sessions: set[int] = set()
    stream = sys.stdin.buffer
    clean = False
    for line in stream:
        text = line.strip()
        if text == b"exit":
            clean = True
            break
        if text[:1] == b"+":
            sessions.add(int(text[1:]))
        elif text[:1] == b"-":
            sessions.discard(int(text[1:]))
    if not clean and (token or sessions):
        kill_job(token, sessions)


if __name__ == "__main__":
    main()
