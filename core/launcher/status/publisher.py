"""The agent's side of ``launcher status``: this node's state, published every few seconds.

A daemon thread, started once the first workers run (so the first worker waits for nothing
new), writes :data:`~launcher.status.settings.STATUS_FILE` into the run log directory (written
to a temporary name and renamed over the old one, so a reader never sees half a document) and
keeps that directory open (close-on-exec), so ``launcher status PID`` finds it among the agent's
descriptors in ``/proc/PID/fd``: nothing to clean up, even after a SIGKILL. On a multi-node
job it also writes the same record to the round's workers' store, one key per node
(:func:`~launcher.status.settings.store_key`): every node's agent can reach that store (it is
admitted by address, as the workers are), and so can ``launcher status`` run on any node of the
job, without the rendezvous's credentials.

The thread only reads what the main loop owns (pids, exit codes already collected, counters): it
never waits for, signals or reaps a worker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from launcher.plugins.types import run_log_dir
from launcher.status.gpus import GpuSampler
from launcher.status.procfs import CpuMeter, children, start_ticks, started_at
from launcher.status.settings import (
    PUBLISH_INTERVAL,
    RENDEZVOUS_STATUS_KEY,
    SCHEMA_VERSION,
    STATUS_FILE,
    store_key,
)

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.group import WorkerGroup
    from launcher.hangs.monitor import HangMonitor
    from launcher.health.gate import HealthGate
    from launcher.plan import LaunchPlan
    from launcher.rendezvous.api import RendezvousInfo
    from launcher.status.metrics import MetricsServer
    from launcher.store.client import TCPStoreClient
    from launcher.stragglers.monitor import StragglerMonitor

log = logging.getLogger("launcher.status")

#: Seconds a store call of the publisher may take: a slow store delays the next publish, nothing else.
STORE_TIMEOUT = 3.0


def _encode(doc: dict[str, Any]) -> bytes:
    """The status record as stored: compact JSON."""
    return json.dumps(doc, separators=(",", ":")).encode()


def rank_state(returncode: int | None, hung: bool) -> str:
    """``running``, ``hung``, ``succeeded`` or ``failed``."""
    if returncode is None:
        return "hung" if hung else "running"
    return "succeeded" if returncode == 0 else "failed"


class StatusPublisher:
    """Publishes this node's status (see the module docstring) until :meth:`close`."""

    def __init__(self, plan: LaunchPlan, hangs: HangMonitor | None, *, interval: float = PUBLISH_INTERVAL,
                 stragglers: StragglerMonitor | None = None, gpus: GpuSampler | None = None,
                 health: HealthGate | None = None) -> None:
        self._plan = plan
        self._hangs = hangs
        self._health = health  # the nodes its checks kept out (launcher_kept_out_node)
        self._handler: object = None  # the rendezvous handler: its spares (launcher_spares_waiting)
        self._stragglers = stragglers if stragglers is not None and stragglers.enabled else None
        self._interval = interval
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._group: WorkerGroup | None = None
        self._info: RendezvousInfo | None = None
        self._restarts = (0, plan.max_restarts)
        self._in_place = 0
        self._cpu = CpuMeter()
        self._gpus = gpus or GpuSampler()
        self._lines: dict[int, tuple[int, float]] = {}  # local rank -> (lines so far, when)
        self._steps: dict[int, tuple[int, float]] = {}  # local rank -> (heartbeat(step) calls, when)
        self._store: TCPStoreClient | None = None
        self._store_address: tuple[str, int] | None = None
        self._path: str | None = None
        self._dir_fd: int | None = None  # the status file's directory, open for `launcher status PID`
        self._private_dir: str | None = None
        pid = os.getpid()
        self._agent = {"pid": pid, "start_ticks": start_ticks(pid), "started_at": started_at(pid) or time.time()}
        self._thread: threading.Thread | None = None
        self._latest: dict[str, Any] | None = None
        self._metrics: MetricsServer | None = None
        self._metrics_port: int | None = None

    def attach(self, group: WorkerGroup, info: RendezvousInfo, restarts_used: int,
               recoveries_in_place: int = 0, handler: object = None) -> StatusPublisher:
        """The workers of a new round run: publish them now, then every interval; ``self``.

        ``restarts_used``: the restarts that followed a failure (re-forming after a node left
        uses none, and a refunded one is taken back), so ``max_restarts - restarts_used`` are left;
        ``recoveries_in_place``: how many of them kept the surviving workers (launcher.recovery);
        ``handler``: the round's rendezvous handler, whose ``spares_waiting`` (launcher's own
        dynamic rendezvous has it; it costs no store read) the record carries.
        """
        with self._lock:
            self._group, self._info = group, info
            self._handler = handler
            self._restarts = (restarts_used, max(0, self._plan.max_restarts - restarts_used))
            self._in_place = recoveries_in_place
            self._lines, self._steps = {}, {}
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="launcher-status", daemon=True)
            self._thread.start()
        self._wake.set()
        return self

    def close(self, exit_code: int) -> None:
        """Stop publishing; leave a last record that says the job ended, and how."""
        self._stopping = True
        self._wake.set()
        store = self._store
        if store is not None:
            store.close()  # interrupts a store call the thread is in: the job's end waits for none
        if self._thread is not None:
            # Bounded: a thread still connecting to a store that went away with the round (a few
            # seconds at most) is a daemon, and writes nothing once it sees _stopping.
            self._thread.join(timeout=2.0)
        with contextlib.suppress(Exception):
            doc = self._document(ended={"exit_code": exit_code, "at": round(time.time(), 3)})
            if doc is not None:
                self._write(_encode(doc))
        if self._metrics is not None:
            self._metrics.close()
        with contextlib.suppress(Exception):
            self._gpus.close()
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None
        if self._private_dir is not None:
            import shutil

            shutil.rmtree(self._private_dir, ignore_errors=True)

    def _serve_metrics(self, port: int) -> None:
        from launcher.status.metrics import MetricsServer

        hangs = self._hangs
        try:
            self._metrics = MetricsServer(port, lambda: self._latest, lambda: hangs.hangs_seen if hangs else 0)
        except OSError as exc:  # taken since the plan checked it: the job goes on without metrics
            log.warning("cannot serve metrics on port %d: %s; the job goes on without them", port, exc)
            return
        self._metrics_port = self._metrics.port
        # Said where it is seen by default when the kernel chose the port: nobody else knows it.
        (log.warning if port == 0 else log.info)("metrics on http://%s:%d/metrics", self._plan.node,
                                                 self._metrics.port)

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        if self._plan.metrics_port is not None:  # here, not in attach(): the main loop waits for none of it
            self._serve_metrics(self._plan.metrics_port)
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stopping:
                return
            try:
                doc = self._document()
                if doc is not None and not self._stopping:
                    self._latest = doc
                    data = _encode(doc)  # once: the file and both stores hold the same bytes
                    self._write(data)
                    self._publish_to_store(doc, data)
                    self._publish_to_rendezvous(doc, data)
            except Exception:  # never let the job's view take the job down
                log.debug("cannot publish the status", exc_info=True)

    def _document(self, ended: dict[str, Any] | None = None) -> dict[str, Any] | None:
        with self._lock:
            group, info = self._group, self._info
            used, left = self._restarts
            in_place = self._in_place
        if group is None or info is None:
            return None
        plan = self._plan
        hung: set[int] = set()
        ages: dict[int, float | None] = {}
        waits: dict[int, float] = {}
        optimizer_steps: dict[int, int] = {}
        if self._hangs is not None and ended is None:
            with contextlib.suppress(Exception):  # the heartbeat table may close under us
                for progress in self._hangs.progress():
                    ages[progress.local_rank] = None if progress.age is None else round(progress.age, 3)
                    if progress.optimizer_steps > 0:
                        optimizer_steps[progress.local_rank] = progress.optimizer_steps
                    if progress.waiting is not None:  # told to beat (--hang-timeout), not once yet
                        waits[progress.local_rank] = round(progress.waiting, 3)
                    if progress.hung:
                        hung.add(progress.local_rank)
        steps = self._step_totals(optimizer_steps) if ended is None else {}
        slots = list(group.slots)
        pids = [s.process.pid for s in slots if s.process is not None and s.process.returncode is None]
        usage = self._cpu.measure(pids)
        gpus = {}
        if ended is None and self._gpus.usable:  # a node without NVML lists no process trees
            gpus = self._gpus.sample({pid: [pid, *children(pid)] for pid in pids})
        now = time.monotonic()
        ranks = []
        for slot in slots:
            process = slot.process
            returncode = process.returncode if process is not None else None
            pid = process.pid if process is not None else None
            cpu, rss = usage.get(pid, (None, None)) if pid is not None else (None, None)
            ranks.append({
                "rank": slot.global_rank,
                "local_rank": slot.local_rank,
                "pid": pid,
                "state": rank_state(returncode, slot.local_rank in hung) if process is not None else "starting",
                "exit_code": returncode,
                "restarts": used,
                "heartbeat_age_s": ages.get(slot.local_rank),
                "no_heartbeat_yet_s": waits.get(slot.local_rank) if returncode is None else None,
                "lines_per_s": self._line_rate(slot.local_rank, slot.streams, now),
                "step": steps[slot.local_rank][0] if slot.local_rank in steps else None,
                "steps_per_s": self._step_rate(slot.local_rank, steps.get(slot.local_rank), now),
                "cpu_percent": cpu,
                "rss_bytes": rss,
                "gpu": gpus[pid].device if pid in gpus else None,
                "gpu_util_percent": gpus[pid].utilization if pid in gpus else None,
                "gpu_memory_bytes": gpus[pid].memory if pid in gpus else None,
            })
        return {
            "schema": SCHEMA_VERSION,
            "run_id": plan.run_id,
            # The rendezvous's id of the node (names it in failure and hang reports too): unique
            # where hosts share a name, as containers and namespaces often do.
            "node": info.participants[info.group_rank] if info.group_rank < len(info.participants) else plan.node,
            "group_rank": info.group_rank,
            # --topology: where this node sits (its path, spine0.leaf12), as its join record says.
            "topology": str(plan.topology) if plan.topology is not None else None,
            "group_world_size": info.group_world_size,
            "round": info.round,
            "restarts_used": used,
            "restarts_left": left,
            "recoveries_in_place": in_place,
            "max_restarts": plan.max_restarts,
            "hang_detection": self._hangs is not None,
            "straggler_detection": self._stragglers is not None,
            "slow_ranks": list(self._stragglers.slow_ranks) if self._stragglers is not None else [],
            "last_hang": self._hangs.last_hang if self._hangs is not None else None,
            # The timeouts in force, seconds per phase (--hang-timeout auto: as learned so far).
            "hang_timeouts": self._hangs.hang_timeouts() if self._hangs is not None else None,
            "agent": self._agent,
            "store": {"host": info.master_addr, "port": info.master_port} if info.group_world_size > 1 else None,
            "interval_s": self._interval,
            "metrics_port": self._metrics_port,
            # Attributes the main loop keeps up to date: reading them costs no store operation.
            "spares_waiting": getattr(self._handler, "spares_waiting", None),
            "kept_out": self._kept_out(),
            "updated_at": round(time.time(), 3),
            "ended": ended,
            "ranks": ranks,
        }

    def _kept_out(self) -> list[dict[str, str]] | None:
        """The nodes health checks kept out (``node`` as the logs name it, ``check``); ``None``
        where the rendezvous keeps no record of them."""
        seen = self._health.kept_out if self._health is not None else None
        return None if seen is None else [{"node": record.label, "check": record.check} for record in seen]

    def _line_rate(self, local_rank: int, streams: list[Any], now: float) -> float | None:
        """Output lines per second since the last publish (``None`` the first time)."""
        lines = sum(int(getattr(stream, "newlines", 0)) for stream in streams)
        before = self._lines.get(local_rank)
        self._lines[local_rank] = (lines, now)
        if before is None or now <= before[1]:
            return None
        return round(max(0, lines - before[0]) / (now - before[1]), 2)

    def _step_totals(self, optimizer_steps: dict[int, int]) -> dict[int, tuple[int, int]]:
        """local rank -> (last step, steps counted) of ranks that gave a step: to
        ``launcher.heartbeat(step)`` (with ``--straggler-detection``, whose per-rank page the
        worker writes steps into), or else the optimizer steps it took (``optimizer_steps``, seen
        with ``--hang-timeout``: the count is both the step and the calls)."""
        totals = {local_rank: (steps, steps) for local_rank, steps in optimizer_steps.items()}
        if self._stragglers is not None:
            totals.update((local_rank, (t.step, t.steps))
                          for local_rank, t in enumerate(self._stragglers.totals()) if t.steps > 0)
        return totals

    def _step_rate(self, local_rank: int, step: tuple[int, int] | None, now: float) -> float | None:
        """``launcher.heartbeat(step)`` calls (or optimizer steps, see :meth:`_step_totals`) per
        second since the last publish (``None`` the first time, or without steps). Calls, not step
        numbers: a job resumed from a checkpoint, or counting micro-batches, still gives its real
        pace."""
        if step is None:
            self._steps.pop(local_rank, None)
            return None
        before = self._steps.get(local_rank)
        self._steps[local_rank] = (step[1], now)
        if before is None or now <= before[1] or step[1] < before[0]:  # a fresh worker counts from 0
            return None
        return round((step[1] - before[0]) / (now - before[1]), 2)

    def _write(self, data: bytes) -> None:
        path = self._path or self._status_path()
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # the last write comes from close()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if self._dir_fd is None:
            # Close-on-exec: workers do not inherit it. It dies with the agent, however it ends.
            self._dir_fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _status_path(self) -> str:
        logs_specs = self._plan.logs_specs
        directory = run_log_dir(logs_specs) or getattr(logs_specs, "_run_log_dir", None)
        if not directory or not os.path.isdir(directory):  # a LogsSpecs without a directory
            from launcher.private_dirs import make_private_dir

            directory = self._private_dir = make_private_dir("launcher_status_")
        self._path = os.path.join(directory, STATUS_FILE)
        return self._path

    def _publish_to_store(self, doc: dict[str, Any], data: bytes) -> None:
        store = doc["store"]
        if store is None:
            return
        address = (str(store["host"]), int(store["port"]))
        try:
            if self._store is None or self._store_address != address:
                if self._store is not None:
                    self._store.close()
                    self._store = None
                from launcher.store.client import TCPStoreClient

                store = TCPStoreClient(address[0], address[1], timeout=STORE_TIMEOUT,
                                       connect_timeout=STORE_TIMEOUT, refused_timeout=1.0)
                if self._stopping:
                    store.close()
                    return
                self._store, self._store_address = store, address
            self._store.set(store_key(doc["run_id"], doc["group_rank"]), data)
        except Exception as exc:  # the round's store goes away when the round ends
            log.debug("cannot publish the status to the store: %s", exc)
            if self._store is not None:
                self._store.close()
            self._store = None

    def _publish_to_rendezvous(self, doc: dict[str, Any], data: bytes) -> None:
        """The record into the rendezvous's own store too (c10d's, etcd), below the round's agent
        keys (:func:`~launcher.status.settings.rendezvous_status_key`): ``launcher status
        --rdzv-endpoint`` reads it there from any host the rendezvous admits, with the job's
        credentials, where the workers' store admits only the job's nodes."""
        info = self._info
        if info is None or info.store is None or info.group_world_size < 2:
            return
        from launcher.rendezvous.store_ops import RoundStore

        if not isinstance(info.store, RoundStore):  # static, torch's handlers: no round keys to read
            return
        try:
            info.store.set(RENDEZVOUS_STATUS_KEY.format(group_rank=doc["group_rank"]), data)
        except Exception as exc:  # the store is the rendezvous's: its own errors are its to report
            log.debug("cannot publish the status to the rendezvous store: %s", exc)
