"""CPU time, memory and start times of processes, from ``/proc`` (Linux; no psutil needed)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (field 3, the state, first);
    ``None`` when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            # The name may hold spaces and parentheses: split after its last ")".
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_and_rss(pid: int) -> tuple[float, int] | None:
    """``(CPU seconds used so far, resident bytes)`` of ``pid``; ``None`` when it is gone or a zombie."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 22 or fields[0] in (b"Z", b"X"):
        return None
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[21]) * _PAGE
    except ValueError:
        return None


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` in clock ticks since boot: with the pid, it names one process."""
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def started_at(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the epoch."""
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    try:
        with open("/proc/stat", "rb") as handle:
            for line in handle:
                if line.startswith(b"btime "):
                    return int(line.split()[1]) + ticks / _TICKS
    except (OSError, ValueError, IndexError):
        pass
    return None


class CpuMeter:
    """CPU % of processes between two calls of :meth:`measure` (the first call gives ``None``)."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float]] = {}

    def measure(self, pids: Iterable[int]) -> dict[int, tuple[float | None, int | None]]:
        """``pid -> (CPU % since the last call or None, resident bytes or None)``."""
        now = time.monotonic()
        seen: dict[int, tuple[float | None, int | None]] = {}
        last: dict[int, tuple[float, float]] = {}
        for pid in pids:
            sample = cpu_and_rss(pid)
            if sample is None:
                seen[pid] = (None, None)
                continue
            cpu, rss = sample
            before = self._last.get(pid)
            percent = None
            if before is not None and now > before[1]:
                percent = round(100.0 * max(0.0, cpu - before[0]) / (now - before[1]), 1)
            seen[pid] = (percent, rss)
            last[pid] = (cpu, now)
        self._last = last
        return seen


def sample_cpu(pids: Iterable[int], seconds: float) -> dict[int, tuple[float | None, int | None]]:
    """CPU % over the next ``seconds`` and resident bytes now, of every pid in ``pids``."""
    pids = list(pids)
    meter = CpuMeter()
    meter.measure(pids)
    time.sleep(seconds)
    return meter.measure(pids)


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (of each of its threads), from ``/proc/PID/task/*/children``."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found += [int(child) for child in handle.read().split()]
        except (OSError, ValueError):
            continue
    return found
