"""The watchdog process: kills the workers of an agent that died without cleaning up.

Run as ``python -I -S _watchdog_main.py`` (isolated, no site: it starts in milliseconds and
imports nothing of launcher). The agent writes ``+PID`` for each worker it starts (the worker is
the leader of its own session), ``-PID`` when it reaped one, and ``exit`` when it shuts down
cleanly. If standard input ends without ``exit``, the agent is gone: every process in a
registered worker's session, and every descendant of a registered worker, is SIGKILLed.
"""

import contextlib
import os
import signal
import sys
import time


def process_stat(pid):
    """(ppid, session id) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: parse after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    return int(fields[1]), int(fields[3])


def descendants(roots):
    """``roots`` and every process below them, by the kernel's children lists (no full scan)."""
    found = set()
    pending = [pid for pid in roots]
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


def session_tree(sessions):
    """Pids in the given sessions, the session leaders, and all their descendants."""
    table = {}
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


def kill_session_trees(sessions, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doomed = session_tree(sessions)
        if not doomed:
            return
        for pid in doomed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def main():
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)  # outlive the agent's own signals to clean up after it
    sessions = set()
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
    if not clean and sessions:
        kill_session_trees(sessions)


if __name__ == "__main__":
    main()
