"""``launcher status`` as text: a header with the job, one row per rank."""

from __future__ import annotations

from typing import Any

COLUMNS = ("NODE", "RANK", "LOCAL", "PID", "STATE", "RESTARTS", "HEARTBEAT", "STEPS/S", "LINES/S", "CPU%", "RSS",
           "GPU", "GPU%", "GPU-MEM")


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024  # type: ignore[assignment]
    return "-"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s ago"


def _heartbeat(rank: dict[str, Any]) -> str:
    waiting = rank.get("no_heartbeat_yet_s")
    if rank["heartbeat_age_s"] is None and waiting is not None:
        return f"no heartbeat yet after {waiting:.0f}s"
    return _seconds(rank["heartbeat_age_s"])


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def _timeout(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.2g} s"


def _in_place(job: dict[str, Any]) -> str:
    count = int(job.get("recoveries_in_place") or 0)
    return f" ({count} in place)" if count else ""


def render(status: dict[str, Any]) -> str:
    """The text ``launcher status`` prints for one ``--json`` document."""
    job = status["job"]
    found = len(status["nodes"])
    world = job["world_size"] if job["world_size"] is not None else f"{len(status['ranks'])}+"
    lines = [
        f"job {job['run_id']}: {found} of {job['nodes']} node(s), world size {world}, round {job['round']}, "
        f"restarts {job['restarts_used']} used{_in_place(job)} / {job['restarts_left']} left, "
        f"elapsed {_elapsed(job['elapsed_s'])}"
    ]
    if job["hung_ranks"]:
        lines.append(f"hung ranks: {', '.join(map(str, job['hung_ranks']))}")
    if job.get("slow_ranks"):
        lines.append(f"slow ranks (stragglers): {', '.join(map(str, job['slow_ranks']))}")
    hang = job.get("last_hang")
    if hang and hang.get("lines"):
        lines.append(f"last hang (attempt {hang.get('attempt')}): {hang['lines'][0]}")
        lines += [f"  {line}" for line in hang["lines"][1:]]
    timeouts = job.get("hang_timeouts")
    if timeouts and "start" in timeouts:  # learned (--hang-timeout auto); a fixed one is the user's own
        lines.append("hang timeouts: " + ", ".join(
            f"{phase} {_timeout(seconds) if seconds is not None else 'not learned yet'}"
            for phase, seconds in timeouts.items()))
    if job["failed_ranks"]:
        lines.append(f"failed ranks: {', '.join(map(str, job['failed_ranks']))}")
    if status["missing_nodes"]:
        why = f" ({status['store_problem']})" if status["store_problem"] else ""
        lines.append(f"no status yet from the node(s) with group rank {', '.join(map(str, status['missing_nodes']))}"
                     f"{why}")
    # --topology: each node's group rank and path beside its id (the columns only where a node has one).
    paths = {node.get("group_rank"): node.get("topology") for node in status["nodes"]}
    placed = any(paths.values())
    columns = (COLUMNS[0], "GROUP", "PATH", *COLUMNS[1:]) if placed else COLUMNS
    rows: list[tuple[str, ...]] = [columns]
    for rank in status["ranks"]:
        state = rank["state"] if rank["exit_code"] in (None, 0) else f"{rank['state']} ({rank['exit_code']})"
        where = (str(rank["group_rank"]), paths.get(rank["group_rank"]) or "-") if placed else ()
        rows.append((
            str(rank["node"]), *where, str(rank["rank"]), str(rank["local_rank"]), str(rank["pid"] or "-"), state,
            str(rank["restarts"]), _heartbeat(rank),
            _number(rank.get("steps_per_s")), _number(rank["lines_per_s"]),
            _number(rank["cpu_percent"]), _size(rank["rss_bytes"]),
            _number(rank.get("gpu")), _number(rank.get("gpu_util_percent")), _size(rank.get("gpu_memory_bytes")),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines) + "\n"
