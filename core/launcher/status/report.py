"""Finding a job's status and putting every node's together: what ``launcher status`` shows.

A target is an agent's pid or a log directory (a ``--log-dir`` or one run's directory in it).
The local node's record comes from the agent's status file; the other nodes' from the round's
workers' store, whose address the local record names (see :mod:`launcher.status.publisher`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from launcher.errors import LaunchError, UsageError
from launcher.status.procfs import children, sample_cpu, start_ticks
from launcher.status.settings import CPU_SAMPLE_S, SCHEMA_VERSION, STATUS_FILE, store_key
from launcher.values import quote

USAGE = ("usage: launcher status PID|LOGDIR [--json] [--watch] [--interval SECONDS], or launcher status "
         "--rdzv-endpoint HOST:PORT --rdzv-id ID [--rdzv-backend NAME] [--rdzv-conf K=V,...] [--json] [--watch]")
#: How long reading the other nodes' records may take in all.
STORE_TIMEOUT = 5.0


class JobNotRunning(LaunchError):
    """The target names a job that ended, or no job at all (one line, exit status 1)."""


def status_files(target: str) -> list[str]:
    """The status files ``target`` (a pid or a directory) leads to; a :class:`UsageError` for a
    target that is neither, :class:`JobNotRunning` for a pid that runs no job."""
    if target.isascii() and target.isdigit():
        return [_file_of_pid(int(target))]
    if not os.path.isdir(target):
        raise UsageError(f"launcher status: {quote(target)} is neither a pid nor a directory; {USAGE}")
    found = [os.path.join(target, STATUS_FILE)]
    with contextlib.suppress(OSError):
        found += [os.path.join(entry.path, STATUS_FILE) for entry in os.scandir(target) if entry.is_dir()]
    found = [path for path in found if os.path.isfile(path)]
    if not found:
        raise UsageError(
            f"launcher status: {quote(target)} is not a launcher job's log directory (no {STATUS_FILE} in it or in "
            "its run directories); give the --log-dir of a job, one run's directory in it, or the agent's pid"
        )
    return found


def _file_of_pid(pid: int) -> str:
    """The status file of the agent ``pid``: in the directory it keeps open (see
    :mod:`launcher.status.publisher`), found among its descriptors."""
    path = _own_status_file(pid)
    if path is not None:
        return path
    raise JobNotRunning(
        f"process {pid} is not a launcher agent whose workers run (give the pid of the "
        "`launcher` process, or the job's log directory)"
    )


def _own_status_file(pid: int) -> str | None:
    """The status file among ``pid``'s open descriptors (``None``: it holds none); :class:`JobNotRunning`
    when there is no such process or it cannot be looked into."""
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        raise JobNotRunning(f"no process has pid {pid}: no job to show") from None
    except OSError as exc:
        raise JobNotRunning(f"cannot look into process {pid} ({exc.strerror or exc}): give the job's log "
                            "directory instead") from None
    for descriptor in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:
            continue  # closed meanwhile
        path = os.path.join(target, STATUS_FILE)
        if target.startswith("/") and os.path.isfile(path):
            return path
    return None


def agents_below(pid: int) -> list[int]:
    """The launcher agents among ``pid``'s descendants (the topmost of each branch: an agent's own
    children are its workers), in the order found."""
    found: list[int] = []
    queue = children(pid)
    seen = {pid}
    while queue:
        child = queue.pop(0)
        if child in seen:
            continue
        seen.add(child)
        try:
            path = _own_status_file(child)
        except JobNotRunning:  # gone meanwhile, or not ours to look into
            continue
        if path is not None:
            found.append(child)
        else:
            queue += children(child)
    return found


def resolve_agent(target: str) -> tuple[str, str | None]:
    """``target`` itself, or, when it is the pid of a process that wraps one launcher agent
    (``timeout 600 launcher ...``, ``srun``, a shell), that agent's pid and a line saying so.
    A wrapper of several agents is bad input naming them; anything else is left to
    :func:`status_files` to judge."""
    if not (target.isascii() and target.isdigit()):
        return target, None
    pid = int(target)
    if _own_status_file(pid) is not None:
        return target, None
    agents = agents_below(pid)
    if len(agents) == 1:
        return str(agents[0]), f"process {pid} is not a launcher agent; showing the one below it, pid {agents[0]}"
    if agents:
        named = ", ".join(str(agent) for agent in agents)
        raise UsageError(f"launcher status: process {pid} is not a launcher agent; {len(agents)} agents run below "
                         f"it (pids {named}): give one of them")
    return target, None


def load(path: str) -> dict[str, Any] | None:
    """The record in ``path``, or ``None`` when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            doc = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA_VERSION else None


def running(doc: dict[str, Any]) -> bool:
    """Whether the agent that wrote ``doc`` still runs the job (same pid, same start time)."""
    agent = doc.get("agent") or {}
    pid = agent.get("pid")
    return doc.get("ended") is None and isinstance(pid, int) and start_ticks(pid) == agent.get("start_ticks")


def local_record(target: str) -> dict[str, Any]:
    """The status of the running job ``target`` names on this node (the latest, if several)."""
    docs = [doc for doc in map(load, status_files(target)) if doc is not None]
    live = [doc for doc in docs if running(doc)]
    if live:
        return max(live, key=lambda doc: float(doc.get("updated_at", 0)))
    if not docs:
        raise JobNotRunning(f"the status in {quote(target)} cannot be read")
    last = max(docs, key=lambda doc: float(doc.get("updated_at", 0)))
    raise JobNotRunning(_ended_line(last))


def _ended_line(doc: dict[str, Any]) -> str:
    ended = doc.get("ended")
    job = f"job {doc.get('run_id')} on node {doc.get('node')}"
    if ended is not None:
        ago = max(0.0, time.time() - float(ended.get("at", 0)))
        return f"{job} ended {_duration(ago)} ago with exit status {ended.get('exit_code')}"
    pid = (doc.get("agent") or {}).get("pid")
    ago = max(0.0, time.time() - float(doc.get("updated_at", 0)))
    return (f"{job} is not running: its agent (pid {pid}) is gone without saying how it ended "
            f"(killed?); its last status is {_duration(ago)} old")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def other_nodes(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int], str | None]:
    """Every other node's record of this round, the group ranks with none, and why the store
    could not be read (``None`` when it could)."""
    store_at = doc.get("store")
    world, own = int(doc.get("group_world_size", 1)), int(doc.get("group_rank", 0))
    others = [rank for rank in range(world) if rank != own]
    if not others or not store_at:
        return [], others, None
    from launcher.store.client import TCPStoreClient

    try:
        store = TCPStoreClient(str(store_at["host"]), int(store_at["port"]), timeout=STORE_TIMEOUT,
                               connect_timeout=STORE_TIMEOUT, refused_timeout=1.0)
    except Exception as exc:  # the round ended meanwhile, or this host is not admitted
        return [], others, f"cannot reach the job's store at {store_at['host']}:{store_at['port']}: {exc}"
    found: list[dict[str, Any]] = []
    missing: list[int] = []
    try:
        for rank in others:
            key = store_key(str(doc["run_id"]), rank)
            record = json.loads(store.get(key, timeout=STORE_TIMEOUT)) if store.check([key]) else None
            if isinstance(record, dict) and record.get("round") == doc.get("round"):
                found.append(record)
            else:
                missing.append(rank)
    except Exception as exc:
        return found, [r for r in others if r not in {d["group_rank"] for d in found}], f"store read failed: {exc}"
    finally:
        store.close()
    return found, missing, None


def job_status(target: str, *, cpu_sample: float = CPU_SAMPLE_S) -> dict[str, Any]:
    """The ``--json`` document (schema in ``docs/status.md``) of the job ``target`` names."""
    local = local_record(target)
    others, missing, problem = other_nodes(local)
    fresh = sample_cpu([r["pid"] for r in local["ranks"] if r["state"] in ("running", "hung")], cpu_sample)
    return assemble([local, *others], missing, problem, local=local, fresh=fresh)


#: Fields of a rank's row that records of an older agent may lack, and what they mean then.
_ROW_DEFAULTS = {"no_heartbeat_yet_s": None, "step": None, "steps_per_s": None, "gpu": None, "gpu_util_percent": None,
                 "gpu_memory_bytes": None}


def assemble(records: list[dict[str, Any]], missing: list[int], problem: str | None, *,
             local: dict[str, Any] | None = None, fresh: dict[int, Any] | None = None) -> dict[str, Any]:
    """The ``--json`` document of every node's ``records`` (``local``: this node's own, whose
    ``fresh`` CPU samples replace its agent's); ``missing``: the group ranks without one."""
    now = time.time()
    fresh = fresh or {}
    nodes, ranks = [], []
    for doc in sorted(records, key=lambda d: int(d["group_rank"])):
        age = max(0.0, now - float(doc["updated_at"]))
        nodes.append({"node": doc["node"], "group_rank": doc["group_rank"], "topology": doc.get("topology"),
                      "agent_pid": doc["agent"]["pid"], "status_age_s": round(age, 3), "local": doc is local})
        for rank in doc["ranks"]:
            row = {"node": doc["node"], "group_rank": doc["group_rank"], **_ROW_DEFAULTS, **rank}
            for field in ("heartbeat_age_s", "no_heartbeat_yet_s"):  # both as of now, not of the record
                if row[field] is not None:
                    row[field] = round(row[field] + age, 3)
            if doc is local and row["pid"] in fresh:
                row["cpu_percent"], row["rss_bytes"] = fresh[row["pid"]]
            ranks.append(row)
    ranks.sort(key=lambda r: (r["rank"], r["group_rank"]))
    first = min(records, key=lambda d: int(d["group_rank"])) if local is None else local
    started = min(float(doc["agent"]["started_at"]) for doc in records) if local is None \
        else float(local["agent"]["started_at"])
    # Straggler detection judges every rank of the job on every node: the union of what they named.
    slow = sorted({int(r) for doc in records for r in doc.get("slow_ranks", ())})
    # Every node joined the same hang report: the first node's account stands for all.
    last_hang = next((doc["last_hang"] for doc in sorted(records, key=lambda d: int(d["group_rank"]))
                      if doc.get("last_hang")), None)
    # Learned values are the maximum over the nodes (they exchange them; one may lag a few seconds).
    hang_timeouts = _largest([doc.get("hang_timeouts") for doc in records])
    return {
        "schema": SCHEMA_VERSION,
        "job": {
            "run_id": first["run_id"],
            "nodes": int(first["group_world_size"]),
            "world_size": len(ranks) if not missing else None,
            "round": first["round"],
            # Each node counts its own: one that re-formed because another failed, or because a
            # node joined, used none. The job has used what its most charged node used.
            "restarts_used": max(int(doc["restarts_used"]) for doc in records),
            "restarts_left": min(int(doc["restarts_left"]) for doc in records),
            # Of the restarts used, those that kept the surviving workers (launcher.recovery).
            "recoveries_in_place": max(int(doc.get("recoveries_in_place", 0)) for doc in records),
            "max_restarts": first["max_restarts"],
            "elapsed_s": round(max(0.0, now - started), 3),
            "hung_ranks": [r["rank"] for r in ranks if r["state"] == "hung"],
            "failed_ranks": [r["rank"] for r in ranks if r["state"] == "failed"],
            "slow_ranks": slow,
            "straggler_detection": any(bool(doc.get("straggler_detection")) for doc in records),
            "last_hang": last_hang,
            "hang_timeouts": hang_timeouts,
        },
        "nodes": nodes,
        "missing_nodes": missing,
        "store_problem": problem,
        "ranks": ranks,
    }


def _largest(values: list[Any]) -> dict[str, float | None] | None:
    """Per phase, the largest of the nodes' hang timeouts (``None``: no node watches for hangs)."""
    given = [value for value in values if isinstance(value, dict)]
    if not given:
        return None
    phases: dict[str, float | None] = {}
    for value in given:
        for phase, seconds in value.items():
            if seconds is not None:
                phases[phase] = max(float(seconds), phases.get(phase) or 0.0)
            else:
                phases.setdefault(phase, None)
    return phases
