"""The agent's side of hang detection, behind one small interface.

Per job, a :class:`HangMonitor` owns a private directory (on ``/dev/shm`` when there is one)
holding each attempt's heartbeat file and the workers' stack files. Per attempt the agent calls:

1. :meth:`~HangMonitor.prepare` with the workers' environments, before they start (the heartbeat
   slot and the stack-dump bootstrap go into them);
2. :meth:`~HangMonitor.attach` with the started group and the rendezvous outcome;
3. :meth:`~HangMonitor.poll` from its watch loop (never blocks unless a hang is being diagnosed);
   :meth:`~HangMonitor.next_due` says how long the loop may sleep. When ``poll`` returns a
   :class:`~launcher.hangs.report.HangReport`, every rank's stacks have been taken and the
   report printed; the agent then stops the group like a failed one;
4. :meth:`~HangMonitor.detach` once the group is gone.

A hang seen on any node is announced through the rendezvous store (:mod:`launcher.hangs.cluster`),
so every node dumps its ranks and prints the same report.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from launcher.hangs import cluster, flightrec, ondemand, stacks
from launcher.hangs.heartbeat import HEARTBEAT_FILE_ENV, HEARTBEAT_PID_ENV, HEARTBEAT_SLOT_ENV
from launcher.hangs.report import HangReport, NodeSummary, RankEntry, write_stacks_file
from launcher.hangs.watch import HangWatch, HeartbeatTable, LearnedTimeouts, RankProgress
from launcher.private_dirs import make_private_dir
from launcher.rendezvous.api import STORE_FAILURES

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.group import WorkerGroup, WorkerSlot
    from launcher.plan import LaunchPlan
    from launcher.rendezvous.api import RendezvousInfo

log = logging.getLogger("launcher.hangs")

#: Sent to the agent, asks for every local rank's stacks now (the job goes on).
DUMP_SIGNAL = ondemand.DUMP_SIGNAL
#: Seconds between looks at another node's alarm in the store.
ALARM_INTERVAL = 1.0
#: Longest wait for every local worker's stack dump.
DUMP_TIMEOUT = 3.0
#: Seconds added to the check interval when telling ranks that stopped together (the time a
#: check and a dump take on a busy node).
DUMP_SLACK = 0.5
#: Longest wait for the other nodes' summaries after a hang.
COLLECT_TIMEOUT = 15.0
#: Seconds between two exchanges of the learned timeouts with the other nodes (``auto``).
SHARE_INTERVAL = 5.0


def _private_dir() -> str:
    # Heartbeats are written into this file's pages: on tmpfs they never reach a disk.
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        with contextlib.suppress(OSError):
            return make_private_dir("launcher_hangs_", shm)
    return make_private_dir("launcher_hangs_")


class HangMonitor:
    """Hang detection and diagnosis for one agent (see the module docstring)."""

    @classmethod
    def for_plan(cls, plan: LaunchPlan, emit: Callable[..., None]) -> HangMonitor:
        """The monitor of ``plan.hangs`` (``--hang-timeout``) for the agent running ``plan``."""
        from launcher.plugins.types import run_log_dir

        assert plan.hangs is not None
        logs_specs = plan.logs_specs
        settings = plan.settings.get("hangs")
        learned = (LearnedTimeouts(settings.timeout, factor=settings.factor, floor=settings.floor)
                   if settings is not None and getattr(settings, "auto", False) else None)
        return cls(
            plan.hangs.timeout, node=plan.node, run_id=plan.run_id, output=plan.hangs.watch_output, emit=emit,
            learned=learned,
            # The run's log directory, --log-dir or not (a temporary one is then kept).
            log_dir=lambda: run_log_dir(logs_specs) or getattr(logs_specs, "_run_log_dir", None),
            keep_logs=getattr(logs_specs, "keep", None),
        )

    def __init__(self, timeout: float, *, node: str, run_id: str, output: bool = False,
                 log_dir: Callable[[], str | None] | None = None,
                 emit: Callable[..., None] | None = None,
                 keep_logs: Callable[[], None] | None = None,
                 learned: LearnedTimeouts | None = None) -> None:
        """``log_dir`` gives the run's log directory (``None`` when it has none): the stacks files
        go there, and ``keep_logs`` is called when one does (a temporary log directory is then not
        removed when the job succeeds). ``learned``: ``--hang-timeout auto`` (kept here, across
        attempts)."""
        self.timeout = timeout
        #: ``--hang-timeout auto``: the learned timeouts of this job (``None``: a fixed timeout).
        self.learned = learned
        self._next_share = 0.0
        #: Multi-node: when this node may next read or write the job's quiet span, and the local
        #: span seen at the last check (``None``: none open).
        self._next_quiet_read = 0.0
        self._next_quiet_write = 0.0
        self._quiet_seen: tuple[float, float] | None = None
        self.output = output
        self.node = node
        self.run_id = run_id
        self._log_dir = log_dir
        self._keep_logs = keep_logs
        self._dump_signal = False
        self._agent_file: str | None = None
        self._emit = emit
        self.dir = _private_dir()
        # auto: every learned timeout is at least the floor; the span the watch sees between two
        # checks bounds the intervals it learns, so it looks more often than the floor needs.
        self.check_interval = min(1.0, max(0.05, learned.rule.floor / 8 if learned is not None else timeout / 4))
        self._attempt = -1
        self._watch: HangWatch | None = None
        self._group: WorkerGroup | None = None
        self._info: RendezvousInfo | None = None
        self._next_local = 0.0
        self._next_alarm = 0.0
        self._stacks_dir: str | None = None
        self.node_label = node
        self._dump_requested = False
        self._previous_handler: Any = None
        self._dumps = 0
        #: Local ranks already warned about this attempt for sending no heartbeat yet.
        self._silent_warned: set[int] = set()
        #: The report of the last hang (``None`` until one happens).
        self.report: HangReport | None = None
        #: Hangs diagnosed in this job so far (not dumps on demand), for ``--metrics-port``.
        self.hangs_seen = 0
        #: The last hang of this job, for ``launcher status`` (kept across restarts):
        #: ``{"attempt", "blamed_ranks", "lines"}``, the headline's reason first.
        self.last_hang: dict[str, Any] | None = None

    # -- per attempt ---------------------------------------------------------------------------

    def prepare(self, envs: dict[int, dict[str, str]], slots: Sequence[WorkerSlot] = ()) -> None:
        """Give each worker's environment its heartbeat slot and the stack-dump bootstrap (and,
        in output mode, each slot its output callback: set before the start, no line is missed)."""
        self.detach()
        self._attempt += 1
        count = max(envs) + 1 if envs else 0
        table = HeartbeatTable(os.path.join(self.dir, f"heartbeats.{self._attempt}"), count)
        self._watch = HangWatch(table, self.timeout, output=self.output, learned=self.learned,
                                remote_quiet=self._remote_quiet)
        for local_rank, env in envs.items():
            env[HEARTBEAT_FILE_ENV] = table.path
            env[HEARTBEAT_SLOT_ENV] = str(local_rank)
            env.pop(HEARTBEAT_PID_ENV, None)  # recorded by the worker itself at its start-up
            stacks.arm_environment(env, self._stacks_path(local_rank))
            flightrec.arm_environment(env, self._record_path(local_rank, "pipe"), self._record_path(local_rank, "json"))
        if self.output:
            for slot in slots:
                slot.on_output = self._watch.output_seen(slot.local_rank)
        self._write_agent_file()

    def _write_agent_file(self) -> None:
        """Tell ``launcher stacks`` where this agent is (once the run log directory exists)."""
        if not self._dump_signal or self._agent_file is not None:
            return
        directory = self._log_dir() if self._log_dir is not None else None
        if not directory:
            return
        try:
            self._agent_file = ondemand.write_agent_file(directory, node=self.node, run_id=self.run_id)
        except OSError as exc:
            log.debug("cannot write %s in %s: %s", ondemand.AGENT_FILE, directory, exc)

    def _stacks_path(self, local_rank: int) -> str:
        return os.path.join(self.dir, f"stacks.{self._attempt}.{local_rank}")

    def _record_path(self, local_rank: int, kind: str) -> str:
        """The flight-recorder request pipe (``pipe``) or record (``json``) of a local rank."""
        return os.path.join(self.dir, f"flightrec.{self._attempt}.{local_rank}.{kind}")

    def attach(self, group: WorkerGroup, info: RendezvousInfo) -> None:
        """Watch ``group`` (started with the prepared environments)."""
        self._group = group
        self._info = info
        self.report = None
        # Host names may repeat across nodes (containers, network namespaces); the rendezvous'
        # participant id (address_pid_n) names a node the way the rendezvous' own logs do.
        own = info.participants[info.group_rank] if 0 <= info.group_rank < len(info.participants) else ""
        self.node_label = own if self._multinode and own else self.node
        now = time.monotonic()
        self._next_local = now + self.check_interval
        self._next_alarm = now + ALARM_INTERVAL
        self._next_share = now + SHARE_INTERVAL
        self._next_quiet_read = self._next_quiet_write = 0.0
        self._quiet_seen = None
        self._silent_warned = set()
        if self._watch is not None:  # a rank's wait for its first heartbeat counts from here
            for slot in group.slots:
                self._watch.started(slot.local_rank, now)

    def detach(self) -> None:
        """Stop watching the current attempt (its workers are gone)."""
        if self._watch is not None:
            self._watch.table.close()
            self._watch = None
        self._group = None

    def close(self) -> None:
        """Release everything (the stacks files named in reports are kept)."""
        self.detach()
        if self._agent_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._agent_file)
            self._agent_file = None
        if self._previous_handler is not None:
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(DUMP_SIGNAL, self._previous_handler)
            self._previous_handler = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def enable_dump_signal(self, forwarded: list[int]) -> bool:
        """Dump every local rank's stacks on :data:`DUMP_SIGNAL` to the agent (job goes on).

        Not when that signal is one the agent forwards (``--signals-to-handle``), nor off the
        main thread. The agent's wake-up descriptor makes its watch loop notice at once.
        """
        if DUMP_SIGNAL in forwarded or threading.current_thread() is not threading.main_thread():
            return False

        def on_dump_signal(_signum: int, _frame: Any) -> None:
            self._dump_requested = True

        try:
            self._previous_handler = signal.signal(DUMP_SIGNAL, on_dump_signal)
        except (OSError, ValueError):
            return False
        self._dump_signal = True
        return True

    # -- watching ------------------------------------------------------------------------------

    @property
    def _multinode(self) -> bool:
        info = self._info
        return info is not None and info.store is not None and info.group_world_size > 1

    def next_due(self) -> float:
        """Seconds until :meth:`poll` has something to do."""
        due = self._next_local
        if self._multinode:
            due = min(due, self._next_alarm)
        return max(0.0, due - time.monotonic())

    def poll(self) -> HangReport | None:
        """Look for a hung rank here, or another node's alarm; on either, diagnose and report."""
        if self._watch is None or self._group is None or self.report is not None:
            return self.report
        if self._dump_requested:
            self._dump_requested = False
            self.dump_on_demand()
        now = time.monotonic()
        if now >= self._next_local:
            self._next_local = now + self.check_interval
            # A worker that has exited (successfully: a failure ends the attempt at once) beats
            # no more, and is not hung.
            states = self._watch.progress(now, learn=True)
            if self._multinode:
                self._tell_quiet(now)
            if self.learned is None:  # auto judges the start phase itself
                self._warn_silent(states)
            hung = [state for state in states if state.hung and self._running(state.local_rank)]
            if hung:
                first = max(hung, key=lambda state: state.age or 0.0)
                slot = self._slot(first.local_rank)
                rank = slot.global_rank if slot is not None else first.local_rank
                alarm: dict[str, Any] = {
                    "node": self.node_label,
                    "group_rank": self._info.group_rank if self._info else 0,
                    "reason": f"rank {rank} (local rank {first.local_rank}): {_reason_text(first.reason)}",
                }
                if self._multinode:
                    assert self._info is not None and self._info.store is not None
                    try:
                        alarm = cluster.raise_alarm(self._info.store, self._prefix(), alarm)
                    except STORE_FAILURES as exc:
                        log.warning("cannot tell the other nodes about the hang: %s", exc)
                return self._diagnose(alarm)
        if self._multinode and now >= self._next_alarm:
            self._next_alarm = now + ALARM_INTERVAL
            assert self._info is not None and self._info.store is not None
            try:
                remote = cluster.check_alarm(self._info.store, self._prefix())
            except STORE_FAILURES as exc:
                log.debug("cannot look for a hang alarm: %s", exc)
                remote = None
            if remote is not None:
                return self._diagnose(remote)
        if self._multinode and self.learned is not None and now >= self._next_share:
            self._next_share = now + SHARE_INTERVAL
            self._share_learned()
        return None

    def _share_learned(self) -> None:
        """Give the other nodes this node's learned timeouts and take theirs (the maximum), in
        O(1) store requests (:func:`launcher.hangs.cluster.share_learned`)."""
        assert self.learned is not None and self._info is not None and self._info.store is not None
        learned = self.learned
        try:
            merged = cluster.share_learned(self._info.store, cluster.learned_key(self.run_id),
                                           {phase: getattr(learned, phase) for phase in learned.PHASES})
        except STORE_FAILURES as exc:
            log.debug("cannot exchange the learned hang timeouts: %s", exc)
            return
        for phase in learned.PHASES:
            learned.offer(merged.get(phase), source="the largest of the nodes'", phase=phase)

    def _tell_quiet(self, now: float) -> None:
        """Multi-node: while a local rank is in a quiet section, write its span for the other
        nodes (once a second), and once more when it ends (one request each)."""
        assert self._watch is not None and self._info is not None and self._info.store is not None
        span, seen = self._watch.local_quiet, self._quiet_seen
        self._quiet_seen = span
        if span is None:
            if seen is None:
                return
            span = seen  # it ended: its last span, once
        elif now < self._next_quiet_write:
            return
        start, end = span
        self._next_quiet_write = now + ALARM_INTERVAL
        offset = time.time() - time.monotonic()  # monotonic to wall clock: the other nodes' clocks are not ours
        try:
            cluster.publish_quiet(self._info.store, cluster.quiet_key(self._prefix()), start + offset, end + offset)
        except STORE_FAILURES as exc:
            log.debug("cannot tell the other nodes about a quiet section: %s", exc)

    def _remote_quiet(self, now: float) -> tuple[float, float] | None:
        """The last quiet span of a rank of the job another node wrote, in this node's monotonic
        time (``None``: none, or not asked again yet: at most one read a second)."""
        if not self._multinode or now < self._next_quiet_read:
            return None
        assert self._info is not None and self._info.store is not None
        self._next_quiet_read = now + ALARM_INTERVAL
        try:
            span = cluster.read_quiet(self._info.store, cluster.quiet_key(self._prefix()))
        except STORE_FAILURES as exc:
            log.debug("cannot read the other nodes' quiet sections: %s", exc)
            return None
        if span is None:
            return None
        offset = time.time() - time.monotonic()
        return span[0] - offset, min(now, span[1] - offset)

    def hang_timeouts(self) -> dict[str, Any] | None:
        """The timeouts in force, seconds per phase, for ``launcher status`` and ``/metrics``:
        ``{"start", "steady", "checkpoint"}`` with ``auto`` (``None`` until learned), ``{"steady"}``
        with a fixed timeout."""
        if self.learned is not None:
            return self.learned.as_dict()
        return {"steady": self.timeout}

    def _warn_silent(self, states: list[RankProgress]) -> None:
        """Once per rank and attempt, in one line per check: the running ranks that have sent no
        heartbeat for the hang timeout since they started are not watched (never judged hung, see
        docs/hangs.md): say so."""
        named = []
        waited = 0.0
        for state in states:
            if state.waiting is None or state.waiting < self.timeout or state.local_rank in self._silent_warned:
                continue
            if not self._running(state.local_rank):
                continue
            self._silent_warned.add(state.local_rank)
            slot = self._slot(state.local_rank)
            rank = slot.global_rank if slot is not None else state.local_rank
            pid = slot.process.pid if slot is not None and slot.process is not None else None
            named.append(f"rank {rank} (local rank {state.local_rank}, pid {pid})")
            waited = max(waited, state.waiting)
        if not named:
            return
        what = "heartbeat or output line" if self.output else "heartbeat"
        who = named[0] if len(named) == 1 else f"{len(named)} ranks, {', '.join(named)}"
        # A heartbeat is any sign of progress: a collective completed, an optimizer step taken
        # (seen by the start-up hook) or a launcher.heartbeat() call.
        one = len(named) == 1
        log.warning("%s: no %s yet after %.0f s: not watched for hangs until %s a collective or an optimizer "
                    "step or %s launcher.heartbeat()%s", who, what, waited, "it completes" if one else "they complete",
                    "calls" if one else "call", "" if self.output else " (or give --hang-watch output)")

    def dump_on_demand(self) -> HangReport | None:
        """Take and print every local rank's stacks now, without stopping anything."""
        if self._watch is None or self._group is None:
            return None
        report = self._diagnose({"node": self.node_label, "reason": "stacks asked for with SIGUSR2"},
                                local_only=True)
        self.report = None  # not a hang: the job goes on
        _print(report)
        return report

    def progress(self) -> list[RankProgress]:
        """Every local rank's progress now, for ``launcher status`` (empty between attempts)."""
        watch = self._watch
        return watch.progress() if watch is not None else []

    def hung_slots(self) -> list[WorkerSlot]:
        """The local workers named hung in the last report (all of them when none is)."""
        if self._group is None:
            return []
        if self.report is None:
            return list(self._group.slots)
        hung = {e.local_rank for e in self.report.hung_ranks if e.node == self.node_label}
        chosen = [slot for slot in self._group.slots if slot.local_rank in hung]
        return chosen or list(self._group.slots)

    def _prefix(self) -> str:
        assert self._info is not None
        return cluster.prefix(self.run_id, self._info.round)

    def _running(self, local_rank: int) -> bool:
        slot = self._slot(local_rank)
        # A function worker that delivered its result only waits for its peers: not hung.
        return (slot is not None and slot.process is not None and slot.process.poll() is None
                and not slot.process.delivered)

    def _slot(self, local_rank: int) -> WorkerSlot | None:
        if self._group is None:
            return None
        for slot in self._group.slots:
            if slot.local_rank == local_rank:
                return slot
        return None

    # -- diagnosis -----------------------------------------------------------------------------

    def _diagnose(self, alarm: dict[str, Any], *, local_only: bool = False) -> HangReport:
        assert self._watch is not None and self._group is not None
        self.hangs_seen += 0 if local_only else 1
        started = time.monotonic()
        targets = []
        allowed: dict[int, set[int]] = {}
        for slot in self._group.slots:
            if slot.process is not None and slot.process.poll() is None:
                targets.append((slot.local_rank, slot.process.pid, self._stacks_path(slot.local_rank)))
                allowed[slot.local_rank] = stacks.process_tree(slot.process.pid)
        dumps = stacks.collect(targets, allowed, timeout=DUMP_TIMEOUT)
        # The collectives each rank entered: asked once its stack is taken (where it waits).
        records = flightrec.request(
            [(local_rank, self._record_path(local_rank, "pipe"), self._record_path(local_rank, "json"))
             for local_rank, _, _ in targets], timeout=DUMP_TIMEOUT,
            pids={local_rank: pid for local_rank, pid, _ in targets})
        # Read after the dump: a rank that stopped a moment after the one that crossed the
        # timeout first (a few ms later, into the same collective) has crossed it too by now.
        progress = {state.local_rank: state for state in self._watch.progress()}
        info = self._info
        summary = NodeSummary(self.node_label, info.group_rank if info else 0)
        for slot in self._group.slots:
            state = progress.get(slot.local_rank)
            dump = dumps.get(slot.local_rank)
            if dump is None and state is not None:  # it exited: not hung, whatever its last beat
                state.hung, state.reason = False, ""
            stopped = dump is not None and stacks.is_stopped_state(dump.native)
            reason = state.reason if state else ""
            if stopped and state is not None and state.hung:
                reason = f"{reason or _reason_text(reason)}; its process is stopped (state T)"
            entry = RankEntry(
                rank=slot.global_rank,
                local_rank=slot.local_rank,
                node=self.node_label,
                pid=(dump.pid if dump is not None else None) or (slot.process.pid if slot.process else None),
                age=state.age if state else None,
                hung=bool(state and state.hung),
                summary=stacks.stack_summary(dump) if dump is not None else "(exited)",
                quiet=state.quiet if state else "",
                reason=reason,
                waiting=state.waiting if state else None,
                stacks=stacks.as_json(dump) if dump is not None else None,
                collective=stacks.in_collective(dump),
                stopped=stopped,
            )
            summary.ranks.append(entry)
        summary.stacks_file = self._stacks_file_path("on_demand" if local_only else "hang")
        for slot in self._group.slots:
            if slot.local_rank in records:
                record = flightrec.summarise(records[slot.local_rank])
                record["rank"] = slot.global_rank
                summary.collectives[str(slot.global_rank)] = record
        self._keep_records(summary.stacks_file, records)
        nodes: list[NodeSummary] = [summary]
        missing: list[int] = []
        omitted, merged_reason = 0, None
        tolerance = self.check_interval + DUMP_SLACK + (ALARM_INTERVAL if self._multinode else 0.0)
        if self._multinode and not local_only:
            assert info is not None and info.store is not None
            nodes, missing, omitted, merged_reason = self._exchange(info, summary, tolerance)
        evidence = {int(rank): record for node in nodes for rank, record in node.collectives.items()}
        report = HangReport(
            detected_by=str(alarm.get("node", "?")),
            reason=str(alarm.get("reason", "a rank stopped making progress")),
            nodes=nodes,
            missing=missing,
            # Ranks that stopped together: detected within one check; other nodes dump later.
            tolerance=tolerance,
            omitted=omitted,
            # Compared here, where every node's evidence is joined.
            collectives=flightrec.analyse(evidence, self._world_size()) if evidence else None,
        )
        if local_only:  # on demand (written so in the stacks file too)
            report.is_hang = False
            report.outcome = "nothing: the job goes on"
        else:
            # Every node names the same rank: the likeliest culprit of the joined report, not the
            # rank that happened to cross the timeout first (report.order_hung).
            # A merged report that left nodes out carries the culprit of the whole one.
            report.reason = merged_reason or report.culprit_reason() or report.reason
        if summary.stacks_file:
            try:
                write_stacks_file(summary.stacks_file, report, summary)
            except OSError as exc:
                log.warning("cannot write the stacks file %s: %s", summary.stacks_file, exc)
                summary.stacks_file = None
        self.report = report
        if not local_only:
            self._doom(report)
            evidence_lines = report.collectives.lines() if report.collectives is not None else []
            self.last_hang = {"attempt": self._attempt, "blamed_ranks": report.blamed_ranks,
                              "lines": [report.reason, *evidence_lines]}
        log.debug("hang diagnosed in %.2f s", time.monotonic() - started)
        return report

    def _doom(self, report: HangReport) -> None:
        """Have the stop that follows SIGKILL this node's culprits at once (their stacks and
        records are taken): the hung ranks the hang is blamed on, and hung ranks that are
        stopped (state T), which could not act on SIGTERM anyway. The other ranks get SIGTERM
        and the grace period as after any failure."""
        if self._group is None:
            return
        blamed = set(report.blamed_ranks)
        doomed = {e.local_rank for e in report.entries
                  if e.node == self.node_label and e.hung and (e.stopped or e.rank in blamed)}
        if doomed:
            self._group.mark_hung(doomed)

    def _world_size(self) -> int | None:
        slots = self._group.slots if self._group is not None else []
        size = slots[0].env.get("WORLD_SIZE", "") if slots else ""
        return int(size) if size.isdigit() else None

    def _keep_records(self, stacks_file: str | None, records: dict[int, dict[str, Any]]) -> None:
        """Each rank's whole flight record beside the stacks file (``launcher bundle`` takes it):
        ``hang_flight_recorder_attempt_0_rank_3.json``."""
        if not stacks_file or not stacks_file.endswith(".txt"):
            return
        import json

        # hang_stacks_attempt_0.txt -> hang_flight_recorder_attempt_0; stacks_attempt_0_2.txt too.
        head, name = os.path.split(stacks_file[: -len(".txt")])
        base = os.path.join(head, name.replace("stacks_", "flight_recorder_", 1))
        for slot in self._group.slots if self._group is not None else []:
            record = records.get(slot.local_rank)
            if record is None or "launcher_note" in record:
                continue
            path = f"{base}_rank_{slot.global_rank}.json"
            try:
                with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
                    json.dump(record, handle)
                os.replace(f"{path}.tmp", path)
            except OSError as exc:
                log.debug("cannot write %s: %s", path, exc)

    def _exchange(self, info: RendezvousInfo, summary: NodeSummary,
                  tolerance: float) -> tuple[list[NodeSummary], list[int], int, str | None]:
        """Publish this node's summary and get the merged report (:func:`launcher.hangs.cluster.exchange`)."""
        assert info.store is not None
        try:
            return cluster.exchange(info.store, self._prefix(), summary, info.group_world_size,
                                    tolerance=tolerance, timeout=COLLECT_TIMEOUT)
        except STORE_FAILURES as exc:
            log.warning("cannot exchange hang summaries with the other nodes: %s", exc)
            return [summary], [], 0, None

    def _stacks_file_path(self, kind: str = "hang") -> str | None:
        # Next to the worker logs: the run's log directory, --log-dir or not.
        directory = self._log_dir() if self._log_dir is not None else None
        if directory:
            if callable(self._keep_logs):  # the report names the file: it outlives a job that then succeeds
                try:
                    self._keep_logs()
                except Exception as exc:  # a LogsSpecs plugin's: the report comes first
                    log.debug("cannot keep the log directory %s: %s", directory, exc)
        else:
            # No log directory at all (--log-dir /dev/null).
            if self._stacks_dir is None:
                # Outlives the job on purpose: the report names it.
                self._stacks_dir = make_private_dir("launcher_hang_")
            directory = self._stacks_dir
        directory = os.path.abspath(directory)  # the report names it: not relative to the agent's cwd
        if kind == "hang":
            return os.path.join(directory, f"hang_stacks_attempt_{self._attempt}.txt")
        self._dumps += 1
        return os.path.join(directory, f"stacks_attempt_{self._attempt}_{self._dumps}.txt")

    def announce(self, outcome: str) -> None:
        """Print the report (with what happens next) and emit ``hang_detected``."""
        report = self.report
        if report is None:
            return
        report.outcome = outcome
        _print(report)
        if self._emit is not None:
            own = next((node for node in report.nodes if node.node == self.node_label), None)
            self._emit(
                "hang_detected",
                detected_by=report.detected_by,
                reason=report.reason,
                hung_ranks=[entry.rank for entry in report.hung_ranks],
                groups=report.to_dict()["groups"],
                stacks_file=own.stacks_file if own else None,
                outcome=outcome,
            )


def _print(report: HangReport) -> None:
    from launcher.logs.pump import CONSOLE_LOCK

    with CONSOLE_LOCK:
        sys.stderr.write(report.render() + "\n")
        sys.stderr.flush()


def _reason_text(reason: str) -> str:
    return reason or "stopped making progress"
