"""The agent's side of straggler detection: read the ranks' timings, agree on a verdict, say it.

Per job, :func:`launcher.stragglers.settings.monitor_for` makes one :class:`StragglerMonitor`
(only with ``--straggler-detection``). Per attempt the agent calls :meth:`~StragglerMonitor.attach`
with the workers' environments and their group, before the group starts: each worker gets a slot
of a shared-memory file and the start-up hook that times its collectives
(:mod:`launcher.stragglers.timing`). A daemon thread then wakes at every interval boundary
(wall-clock multiples of ``--straggler-interval``, the same instants on every node):

1. it reads every local slot (one copy of 64 bytes a rank) and turns the running totals into
   each rank's sample of the interval that just ended;
2. on a multi-node job it rewrites this node's one summary key in the workers' store; one node
   (group rank 0) reads every node's and judges, and every other node reads its verdicts
   (:mod:`launcher.stragglers.exchange`): O(1) store requests a node, whatever the nodes;
3. the judge (this node, when alone) judges a window of the last intervals every node has
   published (at least 4, and enough for 20 collectives a rank:
   :func:`launcher.stragglers.verdict.select_window`); when a verdict changes the named ranks,
   each node prints one line and emits ``straggler_detected``; with ``--straggler-action
   exclude`` it hands newly named ranks to :class:`~launcher.stragglers.exclusion.Exclusion`, which
   the agent's main loop acts on at its next membership check (:meth:`StragglerMonitor.act`).

The thread never touches the workers (it only reads their exit codes already collected) and
uses its own store connection: the agent's main loop waits for none of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from launcher.stragglers import cluster, report
from launcher.stragglers.exchange import Judge, NodeExchange, Verdict
from launcher.stragglers.slots import RankTotals, TimingTable
from launcher.stragglers.timing import STRAGGLER_FILE_ENV, STRAGGLER_HOOK_ENV, STRAGGLER_PID_ENV, STRAGGLER_SLOT_ENV
from launcher.stragglers.verdict import Finding, RankSample

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.group import WorkerGroup
    from launcher.rendezvous.api import RendezvousInfo
    from launcher.store.client import TCPStoreClient
    from launcher.stragglers.exclusion import Exclusion
    from launcher.stragglers.settings import StragglerSettings

log = logging.getLogger("launcher.stragglers")

#: Seconds a store call may take: a slow store delays the next verdict, nothing else.
STORE_TIMEOUT = 3.0
#: Fraction of an interval after its boundary at which a node samples (lets a late clock catch up).
OFFSET = 0.05
HOOK_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timing.py")


class _Mark(NamedTuple):
    at: float
    wait: float
    collectives: int
    steps: int
    active: bool


def _private_dir() -> str:
    from launcher.private_dirs import make_private_dir

    # The workers write into this file's pages: on tmpfs they never reach a disk.
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        with contextlib.suppress(OSError):
            return make_private_dir("launcher_stragglers_", "/dev/shm")
    return make_private_dir("launcher_stragglers_")


class StragglerMonitor:
    """Straggler detection for one agent (see the module docstring)."""

    #: Detection is on (:class:`launcher.stragglers.settings._NoMonitor` says ``False``).
    enabled = True

    def __init__(self, settings: StragglerSettings, *, node: str, run_id: str,
                 emit: Callable[..., None] | None = None, out: Any = None) -> None:
        self.settings = settings
        self.node = node
        self.run_id = run_id
        self._emit = emit
        self._out = out
        self.dir = _private_dir()
        self._attempt = -1
        self._table: TimingTable | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._store: TCPStoreClient | None = None
        #: Every rank ever named, its worst window (kept across attempts), for the final report.
        self.history: dict[int, Finding] = {}
        #: The global ranks named slow now (``launcher status`` shows them).
        self.slow_ranks: list[int] = []
        #: ``--straggler-action exclude`` (launcher.stragglers.exclusion); ``None`` for ``report``.
        self.exclusion: Exclusion | None = None
        if settings.action == "exclude":
            from launcher.stragglers.exclusion import Exclusion

            self.exclusion = Exclusion(emit, self._print)

    # -- per attempt ---------------------------------------------------------------------------

    def attach(self, envs: dict[int, dict[str, str]], group: WorkerGroup, info: RendezvousInfo, *,
               kept: bool = False) -> None:
        """Give each worker (not started yet) its slot and the start-up hook, and watch ``group``.

        ``kept``: the group was kept through an in-place recovery (launcher.recovery): its live
        workers go on writing into the slots they mapped, so the table is kept too; a worker
        started afresh in a slot starts its totals again, which the first look only marks."""
        from launcher.hangs.stacks import SITE_DIR

        table = self._table if kept else None
        self._stop_thread(keep_table=table is not None)
        if self.exclusion is not None:
            self.exclusion.forget()  # a verdict of the last round is not this round's
        if table is None:
            self._attempt += 1
            count = max(envs) + 1 if envs else 0
            table = self._table = TimingTable(os.path.join(self.dir, f"timings.{self._attempt}"), count)
        for local_rank, env in envs.items():
            env[STRAGGLER_FILE_ENV] = table.path
            env[STRAGGLER_SLOT_ENV] = str(local_rank)
            env[STRAGGLER_HOOK_ENV] = HOOK_FILE
            env.pop(STRAGGLER_PID_ENV, None)  # recorded by the worker itself at its start-up
            path = env.get("PYTHONPATH", "")
            if SITE_DIR not in path.split(os.pathsep):
                env["PYTHONPATH"] = SITE_DIR + (os.pathsep + path if path else "")
        own = info.participants[info.group_rank] if 0 <= info.group_rank < len(info.participants) else ""
        label = own if info.group_world_size > 1 and own else self.node
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(table, group, info, label, self._stop),
                                        name="launcher-stragglers", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching, remove the file, and print the job's stragglers, if any."""
        self._stop_thread()
        shutil.rmtree(self.dir, ignore_errors=True)
        line = report.final_line(list(self.history.values()))
        if line is not None:
            self._print([line])
        if self.exclusion is not None and self.exclusion.excluded:
            self._print([report.excluded_line(self.exclusion.excluded)])

    def act(self, handler: Any, info: RendezvousInfo) -> None:
        """At a membership check: act on a verdict (``--straggler-action exclude``; see
        :meth:`launcher.stragglers.exclusion.Exclusion.act`)."""
        if self.exclusion is not None:
            self.exclusion.act(handler, info)

    def before_join(self, handler: Any) -> None:
        """Before a round: name the nodes put out of the last one; raise
        :class:`~launcher.stragglers.exclusion.NodeExcluded` on a node put out."""
        if self.exclusion is not None:
            self.exclusion.before_join(handler)

    def after_join(self, handler: Any) -> None:
        """After a round formed: a spare called in names the straggler whose place it takes."""
        if self.exclusion is not None:
            self.exclusion.after_join(handler)

    def totals(self) -> list[RankTotals]:
        """Every local rank's running totals as its worker last wrote them (steps included; empty
        before the first attempt or once closed): ``launcher status``'s step rates."""
        table = self._table
        try:
            return table.read_all() if table is not None else []
        except (OSError, ValueError):  # closed under us by the main loop
            return []

    def _stop_thread(self, *, keep_table: bool = False) -> None:
        self._stop.set()
        store = self._store
        if store is not None:
            store.close()  # interrupts a store call the thread is in
        if self._thread is not None:
            self._thread.join(timeout=STORE_TIMEOUT + 1.0)
            self._thread = None
        if self._table is not None and not keep_table:
            self._table.close()
            self._table = None

    # -- the thread ----------------------------------------------------------------------------

    def _run(self, table: TimingTable, group: WorkerGroup, info: RendezvousInfo, label: str,
             stop: threading.Event) -> None:
        interval = self.settings.interval
        multinode = info.group_world_size > 1 and bool(info.master_addr)
        marks: dict[int, _Mark] = {}
        local: dict[int, list[RankSample]] = {}  # this node's last intervals (what its key holds)
        slots = {slot.local_rank: slot for slot in group.slots}
        # Alone, this node judges its own intervals; with others, one node judges for all.
        judge = None if multinode else Judge(self.settings.threshold)
        node = (NodeExchange(self.run_id, info.round, info.group_rank, info.group_world_size, self.settings.threshold)
                if multinode else None)
        named: set[int] = set()  # the ranks named now by this attempt's verdicts
        try:
            while not stop.wait(interval - time.time() % interval + OFFSET * interval):
                number = int(time.time() // interval) - 1  # the interval that just ended
                local[number] = self._sample(table.read_all(), slots, marks, label)
                for old in [n for n in local if n <= number - cluster.KEY_INTERVALS]:
                    del local[old]
                if node is not None:
                    verdicts = self._exchange(info, node, number, local, label)
                else:
                    assert judge is not None
                    verdict = judge.take({number: local[number]}, number)
                    verdicts = [verdict] if verdict is not None else []
                for verdict in verdicts:
                    if stop.is_set():
                        break
                    named = self._apply(verdict, named, info, stop)
        except Exception as exc:  # never take the agent down: the job goes on undetected
            log.warning("straggler detection stopped: %s", exc)
        finally:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _sample(self, totals: list[RankTotals], slots: dict[int, Any], marks: dict[int, _Mark],
                label: str) -> list[RankSample]:
        """Each running rank's sample since the last look (none for one not measuring yet)."""
        now = time.monotonic()
        samples = []
        for local_rank, t in enumerate(totals):
            slot = slots.get(local_rank)
            process = getattr(slot, "process", None)
            running = process is not None and process.returncode is None
            mark = _Mark(now, t.wait_at(now), t.collectives, t.steps, t.active)
            previous = marks.get(local_rank)
            marks[local_rank] = mark
            if slot is None or not running or previous is None or not previous.active:
                continue
            samples.append(RankSample(slot.global_rank, label, local_rank, now - previous.at,
                                      max(0.0, mark.wait - previous.wait), mark.collectives - previous.collectives,
                                      mark.steps - previous.steps))
        return samples

    def _apply(self, verdict: Verdict, before: set[int], info: RendezvousInfo, stop: threading.Event) -> set[int]:
        """Take one verdict: the ranks named now, the job's worst findings, and a changed verdict
        said (a line, an event, an exclusion proposed); the ranks it names."""
        self.slow_ranks = [f.rank for f in verdict.named]
        for finding in verdict.named:
            if finding.rank not in self.history or finding.ratio > self.history[finding.rank].ratio:
                self.history[finding.rank] = finding
        change = verdict.change()
        if change is not None and not stop.is_set():
            self._print(report.change_lines(change, self.settings.threshold))
            if self._emit is not None:
                self._emit("straggler_detected", **report.event_fields(change, self.settings.threshold))
            if self.exclusion is not None:
                self.exclusion.propose([f for f in change.named if f.rank not in before], info)
        return {f.rank for f in verdict.named}

    def _exchange(self, info: RendezvousInfo, node: NodeExchange, number: int, local: dict[int, list[RankSample]],
                  label: str) -> list[Verdict]:
        """Publish this node's summary; the verdicts new to it (:mod:`launcher.stragglers.exchange`)."""
        try:
            if self._store is None:
                from launcher.store.client import TCPStoreClient

                self._store = TCPStoreClient(info.master_addr, info.master_port, timeout=STORE_TIMEOUT,
                                             connect_timeout=STORE_TIMEOUT, refused_timeout=1.0)
            return node.interval(self._store, number, local, label)
        except Exception as exc:  # the round's store goes away when the round ends
            log.debug("cannot exchange straggler summaries: %s", exc)
            if self._store is not None:
                self._store.close()
            self._store = None
            return []

    def _print(self, lines: list[str]) -> None:
        from launcher.logs.pump import CONSOLE_LOCK

        out = self._out if self._out is not None else sys.stderr
        with CONSOLE_LOCK:
            for line in lines:
                out.write(line + "\n")
            out.flush()
