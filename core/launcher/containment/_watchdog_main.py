"""The watchdog process: kills the processes of an agent's job once the agent died without cleaning up.

Run as ``python -I -S _watchdog_main.py TOKEN [JOB_CGROUP ORIGIN_CGROUP]`` (isolated, no site: it
starts in milliseconds and imports nothing of launcher). Every process the job starts carries
``TOKEN`` in its environment (``LAUNCHER_JOB_TOKEN``, inherited at any depth and in any session), so
the job's processes can be found by scanning ``/proc/*/environ`` without knowing their pids or
parents. Where the agent contains the job in a cgroup v2 (``launcher.containment.containment``),
``JOB_CGROUP`` is that cgroup's directory: every process of the job is in it or below it, whatever
its environment; the watchdog must not be, and steps out to ``ORIGIN_CGROUP`` (the agent's own
cgroup) if it was born inside. The agent writes ``+PID`` for each worker it starts (the worker is
the leader of its own session) and each orphan it adopted as a child subreaper, ``-PID`` when it
reaped one, ``!ARGV`` (NUL-separated; empty: none) for the death notice, and ``exit`` when it shuts
down cleanly. If standard input ends without ``exit``, the agent is gone: the job's cgroup is
killed (``cgroup.kill``) and removed, then every process carrying the token, in a registered
session, or below a registered process is SIGKILLed, and the scan repeats until it has found
nothing for a while (a worker the agent was forking when it died execs, and so shows its token, a
moment later). Then the death notice runs, if the agent gave one: a
command that tells the rendezvous this node's agent died (``launcher.rendezvous.departures``), so
that the other nodes need not wait for its heartbeat timeout.

The functions here are also the agent's own tools for its stop-time sweep (``group.py``) and its
cgroup (``containment.py``).
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


def proc_stat(pid: int | str) -> tuple[str, int, int] | None:
    """(state, ppid, session id) of a process, zombies included; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: parse after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[3])


def process_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, session id) of a process, or None if it is gone (a zombie is gone: it cannot be killed)."""
    info = proc_stat(pid)
    if info is None or info[0] == "Z":  # a zombie waits for its new parent to reap it, which may take a while
        return None
    return info[1], info[2]


def descendants(roots: list[int], stop: set[int] | frozenset[int] = frozenset()) -> set[int]:
    """``roots`` and every process below them, by the kernel's children lists (no full scan),
    never entering a process in ``stop``."""
    found: set[int] = set()
    pending = [pid for pid in roots if pid not in stop]
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
                    pending.extend(child for child in map(int, handle.read().split()) if child not in stop)
            except OSError:
                pass
    return found


def session_tree(sessions: set[int] | tuple[int, ...], roots: set[int] | tuple[int, ...] = ()) -> set[int]:
    """Pids in the given sessions, the session leaders, ``roots``, and all their descendants."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = process_stat(int(entry))
            if info is not None:
                table[int(entry)] = info
    doomed = {pid for pid, (_, sid) in table.items() if sid in sessions}
    doomed |= {pid for pid in (*sessions, *roots) if pid in table}
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
    """SIGKILL the job's processes until none has been seen for ``quiet`` seconds (or ``timeout``).

    Each round first SIGSTOPs what it finds, and looks again until nothing new turns up: a stopped
    process cannot fork, so a child forked while the round looked (one that clears its environment
    and leaves the session, say) is found below its stopped parent rather than orphaned by its
    parent's death. Then everything found is SIGKILLed (a stopped process dies of it too).
    """
    me = {os.getpid()}
    deadline = time.monotonic() + timeout
    last_seen = time.monotonic()
    while time.monotonic() < deadline:
        doomed: set[int] = set()
        while time.monotonic() < deadline:
            found = set(job_processes(token, me))
            if sessions or doomed or found:
                found |= session_tree(sessions, (*doomed, *found))
            new = found - doomed - me
            if not new:
                break
            for pid in new:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGSTOP)
            doomed |= new
        for pid in doomed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        now = time.monotonic()
        if doomed:
            last_seen = now
        elif now - last_seen >= quiet:
            return
        time.sleep(0.02)


def cgroup_pids(path: str) -> list[int]:
    """Every process in the cgroup ``path`` and the cgroups below it (none once it is gone)."""
    pids: list[int] = []
    for directory, _, _ in os.walk(path):
        try:
            with open(os.path.join(directory, "cgroup.procs"), "rb") as handle:
                pids.extend(int(pid) for pid in handle.read().split())
        except OSError:  # removed meanwhile
            pass
    return pids


def move_to_cgroup(path: str, pid: int = 0) -> None:
    """Move process ``pid`` (0: this one, all its threads) into the cgroup ``path``; raises OSError."""
    fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def cgroup_populated(path: str) -> bool:
    """Whether a live process is in ``path`` or below (the kernel's own count: zombies are not)."""
    try:
        with open(os.path.join(path, "cgroup.events"), "rb") as handle:
            for line in handle:
                if line.startswith(b"populated "):
                    return line.split()[1] != b"0"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    return bool(cgroup_pids(path))


def _write(path: str, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, data)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def cgroup_kill(path: str, timeout: float = 10.0) -> bool:
    """SIGKILL every process in the cgroup ``path`` and below; whether none was left within ``timeout``.

    ``cgroup.kill`` (Linux 5.14) kills them all at once, forks in progress included. Older kernels:
    freeze the cgroup (5.2; a frozen process still dies of SIGKILL) and kill each process listed,
    repeating until the cgroup is empty. Never kills the caller: if it is inside (it could not step
    out), the others are killed one by one.
    """
    me = os.getpid()
    inside = me in cgroup_pids(path)
    one_shot = not inside and _write(os.path.join(path, "cgroup.kill"), b"1")
    freezer = os.path.join(path, "cgroup.freeze")
    frozen = not one_shot and not inside and _write(freezer, b"1")
    deadline = time.monotonic() + timeout
    pause = 0.0005
    try:
        while True:
            others = [pid for pid in cgroup_pids(path) if pid != me] if inside or not one_shot else []
            if not (others if inside else cgroup_populated(path)):
                return True
            for pid in others:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
    finally:
        if frozen:
            _write(freezer, b"0")


def cgroup_remove(path: str) -> bool:
    """Remove the (empty) cgroup ``path`` and every cgroup below it; whether it is gone."""
    for directory, _, _ in os.walk(path, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(directory)
    return not os.path.isdir(path)


def step_out(job: str, origin: str) -> bool:
    """Make sure this process is not in the cgroup ``job`` (move it to ``origin``); whether it is out."""
    if os.getpid() not in cgroup_pids(job):
        return True
    try:
        move_to_cgroup(origin)
    except OSError:
        return False
    return os.getpid() not in cgroup_pids(job)


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)  # outlive the agent's own signals to clean up after it
    token = sys.argv[1] if len(sys.argv) > 1 else ""
    job, origin = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("", "")
    if job:
        # Born while the agent was moving into the job's cgroup: leave it, so as to outlive it.
        step_out(job, origin)
    sessions: set[int] = set()
    stream = sys.stdin.buffer
    clean = False
    notice: list[bytes] = []
    for line in stream:
        text = line.strip()
        if text == b"exit":
            clean = True
            break
        if text[:1] == b"!":
            notice = [part for part in text[1:].split(b"\0") if part]
        elif text[:1] == b"+":
            sessions.add(int(text[1:]))
        elif text[:1] == b"-":
            sessions.discard(int(text[1:]))
    if clean:
        return
    if job and os.path.isdir(job):
        # Every process of the job at once, whatever its session or environment; the token and
        # session scan below still runs for what was never in the cgroup.
        step_out(job, origin)
        cgroup_kill(job)
        cgroup_remove(job)
    if token or sessions:
        kill_job(token, sessions)
    if job and os.path.isdir(job):  # a process moved into it meanwhile (never expected)
        cgroup_kill(job)
        cgroup_remove(job)
    if token:
        remove_step_records(token)
    if notice:
        run_notice(notice)


def remove_step_records(token: str) -> None:
    """Remove the agent's step directory (``launcher.hangs.progress.step_dirs``: ``/dev/shm`` or
    the temporary directory, named after the token), which the agent removes itself unless it was
    killed; the same places as there, spelled out: this script cannot import launcher."""
    name = "launcher-steps-" + token.rsplit(":", 1)[-1]
    roots = ["/dev/shm", *(os.environ.get(v, "") for v in ("TMPDIR", "TEMP", "TMP")), "/tmp", "/var/tmp", "/usr/tmp"]
    for root in dict.fromkeys(r for r in roots if r):
        folder = os.path.join(root, name)
        with contextlib.suppress(OSError):
            for entry in os.listdir(folder):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, entry))
            os.rmdir(folder)


def run_notice(argv: list[bytes], timeout: float = 30.0) -> None:
    """Run the death notice, in a session of its own, for at most ``timeout`` seconds."""
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=timeout,
                       start_new_session=True, check=False)


if __name__ == "__main__":
    main()
