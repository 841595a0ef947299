"""Did the kernel's OOM killer kill a worker? Evidence gathered while the job runs.

A worker killed by ``SIGKILL`` looks the same whether a user ran ``kill -9``, a scheduler
enforced a limit, or the kernel ran out of memory. :class:`OomWatch` tells them apart from two
sources, read only when a worker dies:

* the memory cgroup of the launcher (which its workers share): cgroup v2 ``memory.events`` or
  cgroup v1 ``memory.oom_control``, whose ``oom_kill`` count rises with every OOM kill in it;
* the kernel log, ``/dev/kmsg``, when readable: an ``Out of memory: Killed process <pid>`` or
  ``oom-kill:...,pid=<pid>`` record names the victim.

The kernel log names the process, so it wins when it is readable; it uses the host's process ids,
which differ from ours inside a pid namespace (most containers), where the cgroup count is what
tells. The cgroup count does not name a process: a rise means *some* process of the cgroup was
killed for memory during the run, which is why the report says "likely".
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

_KILLED_PROCESS = re.compile(r"\bKilled process (\d+)\b")  # "Out of memory: Killed process 123 (python)"
_OOM_KILL = re.compile(r"\boom-kill:.*\bpid=(\d+)\b")  # "oom-kill:constraint=...,task=python,pid=123,uid=0"
# Only this many victim records are kept: a node thrashing for days must not grow the agent.
_MAX_VICTIMS = 4096


@dataclass(frozen=True)
class CgroupCounter:
    """One file holding an ``oom_kill`` count: ``memory.events`` (v2) or ``memory.oom_control`` (v1)."""

    path: str

    def read(self) -> int | None:
        """The current ``oom_kill`` count, or ``None`` when the file cannot be read."""
        try:
            with open(self.path, encoding="utf-8") as fp:
                for line in fp:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            return None
        return None


def find_cgroup_counters(
    proc_cgroup: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup"
) -> list[CgroupCounter]:
    """The OOM-kill counters of this process's memory cgroup (v2, v1, or both) that exist here."""
    try:
        with open(proc_cgroup, encoding="utf-8") as fp:
            entries = [line.rstrip("\n").split(":", 2) for line in fp]
    except OSError:
        return []
    # One list of candidate files per hierarchy, best first. Without a cgroup namespace the path
    # in /proc/self/cgroup is the host's, and a container sees its own cgroup mounted as the root
    # of the hierarchy: the root file is the fallback.
    groups: list[list[str]] = []
    for entry in entries:
        if len(entry) != 3:
            continue
        _, controllers, path = entry
        path = path.rstrip("/")
        if controllers == "":  # cgroup v2, mounted alone or beside v1 (as "unified")
            # The nearest cgroup with the memory controller: v2 counts are hierarchical, and the
            # job's own cgroup (launcher.containment.containment) enables no controller.
            ancestors = [path[:i] for i in range(len(path), 0, -1) if i == len(path) or path[i] == "/"]
            for base in (cgroup_root, os.path.join(cgroup_root, "unified")):
                groups.append([*(f"{base}{p}/memory.events" for p in ancestors), f"{base}/memory.events"])
        elif "memory" in controllers.split(","):
            base = os.path.join(cgroup_root, "memory")
            groups.append([f"{base}{path}/memory.oom_control", f"{base}/memory.oom_control"])
    found: list[CgroupCounter] = []
    seen: set[str] = set()
    for candidates in groups:
        for candidate in candidates:
            counter = CgroupCounter(candidate)
            # The v2 root has no memory.events and a v2 hierarchy may lack the memory controller.
            if counter.read() is None:
                continue
            real = os.path.realpath(candidate)
            if real not in seen:
                seen.add(real)
                found.append(counter)
            break
    return found


def _parse_victim(message: str) -> tuple[int, bool] | None:
    """The pid a kernel OOM record names, and whether it is the "Killed process" line."""
    match = _KILLED_PROCESS.search(message)
    if match:
        return int(match.group(1)), True
    match = _OOM_KILL.search(message)
    if match:
        return int(match.group(1)), False
    return None


class OomWatch:
    """Evidence that the kernel killed a process for lack of memory, since :meth:`snapshot`.

    The agent calls :meth:`snapshot` when it starts its workers and :meth:`killed_by_oom` for a
    worker that died of ``SIGKILL``. Nothing is read in between, and every source that cannot
    be read (no permission, no cgroup, not Linux) is silently skipped: the answer is then
    ``False``, never an error.
    """

    def __init__(
        self,
        *,
        counters: Sequence[CgroupCounter] | None = None,
        kmsg_path: str | None = "/dev/kmsg",
    ) -> None:
        """``counters`` default to this process's own memory cgroup; ``kmsg_path=None`` skips the log."""
        self._counters = list(find_cgroup_counters() if counters is None else counters)
        self._kmsg_path = kmsg_path
        self._kmsg_fd: int | None = None
        self._baseline: dict[str, int] = {}
        self._victims: dict[int, str] = {}

    def snapshot(self) -> None:
        """Remember the current counts and start reading the kernel log from its current end."""
        self._baseline = {}
        for counter in self._counters:
            value = counter.read()
            if value is not None:
                self._baseline[counter.path] = value
        self._victims.clear()
        self._close_kmsg()
        if self._kmsg_path:
            try:
                fd = os.open(self._kmsg_path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                return
            try:
                # Only records written from now on concern this run.
                os.lseek(fd, 0, os.SEEK_END)
            except OSError:
                os.close(fd)
                return
            self._kmsg_fd = fd

    def killed_by_oom(self, pid: int) -> bool:
        """Whether the kernel likely killed ``pid`` (or, without a log, a process of our cgroup)."""
        return self.evidence(pid) is not None

    def evidence(self, pid: int) -> str | None:
        """One line saying why :meth:`killed_by_oom` is true for ``pid``, or ``None``."""
        self._read_kernel_log()
        if pid in self._victims:
            return f"kernel log: {self._victims[pid]}"
        for counter in self._counters:
            before = self._baseline.get(counter.path)
            now = counter.read()
            if before is not None and now is not None and now > before:
                return f"{counter.path}: oom_kill rose from {before} to {now} during the run"
        return None

    def close(self) -> None:
        """Release the kernel-log handle (the watch answers from the cgroup counts afterwards)."""
        self._close_kmsg()

    def _close_kmsg(self) -> None:
        if self._kmsg_fd is not None:
            os.close(self._kmsg_fd)
            self._kmsg_fd = None

    def _read_kernel_log(self) -> None:
        if self._kmsg_fd is None:
            return
        # /dev/kmsg returns one record per read; EAGAIN means we are at the end. EPIPE means
        # records we had not read yet were overwritten; the next read resumes after them.
        for _ in range(100_000):
            try:
                chunk = os.read(self._kmsg_fd, 65536)
            except BlockingIOError:
                return
            except BrokenPipeError:
                continue
            except OSError:
                return
            if not chunk:
                return
            for raw in chunk.decode("utf-8", "replace").splitlines():
                if raw.startswith(" "):  # continuation lines carry key=value metadata
                    continue
                _, sep, message = raw.partition(";")
                message = message if sep else raw
                found = _parse_victim(message)
                if found is None or len(self._victims) >= _MAX_VICTIMS:
                    continue
                victim, preferred = found
                # One kill logs both lines; keep the "Killed process" one, which reads better.
                if preferred or victim not in self._victims:
                    self._victims[victim] = message.strip()

    def __enter__(self) -> OomWatch:
        self.snapshot()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # attributes may be gone at interpreter shutdown
            self._close_kmsg()
