"""The agent's side of preemption: the notice, the word to the other nodes, the grace.

::

    signal (--preemption-signals) ──┐
                                    ├─► notice file (every local rank) ─► grace: wait for the workers
    another node's key in the store ┘   key in the store (every node)      to exit; stop the rest

The agent that receives a preemption signal writes the notice into its workers' notice file
(:mod:`launcher.preemption.notice`), then posts it in the rendezvous store under
``launcher/<run_id>/preempted/<round>`` (compare-and-set: the first node's notice stands). Every
other agent looks for that key every :data:`CHECK_INTERVAL` while its workers run (Slurm
signals every node; ``--signal=B:`` and Kubernetes may signal only some), so every rank sees
the notice within a second. The workers then have the grace to save and exit; the ones still
running at its end get the signal, as torchrun would have forwarded it at once, and are killed
``--shutdown-timeout`` later. The job ends with :data:`~launcher.preemption.settings.PREEMPTED_EXIT`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.agent.result import AgentResult
from launcher.preemption.notice import FIELDS, FIELDS_OFFSET, NOTICE_FILE_ENV, NOTICE_SIGNALS_ENV, NOTICE_SIZE
from launcher.preemption.report import PreemptionReport, RankEnd
from launcher.preemption.requeue import PREEMPTION_COUNT_ENV, preemption_count
from launcher.preemption.settings import PREEMPTED_EXIT
from launcher.rendezvous.api import STORE_FAILURES

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.group import WorkerGroup
    from launcher.plan import LaunchPlan
    from launcher.preemption.record import PreemptionRecord
    from launcher.preemption.settings import PreemptionPlan
    from launcher.rendezvous.api import RendezvousInfo

log = logging.getLogger("launcher.preemption")

#: Seconds between looks for another node's notice in the rendezvous store: a notice reaches
#: every rank within a second, at one cheap ``check`` per node per interval.
CHECK_INTERVAL = 0.4
#: Seconds the nodes wait for each other after the grace, so the node that serves the store does
#: not leave while another still posts its outcome.
DONE_WAIT = 5.0


@dataclass(frozen=True)
class Notice:
    """A preemption, as this node learned it."""

    signum: int
    #: Who received the signal: this node's name, or the other node's.
    node: str
    #: CLOCK_MONOTONIC deadline of this node's grace.
    deadline: float
    grace: float
    #: Whether this node received the signal itself.
    local: bool


def key(run_id: str, round_: int) -> str:
    """Where a round's notice is posted in the rendezvous store."""
    return f"launcher/{run_id}/preempted/{round_}"


class PreemptionWatch:
    """One agent's preemption handling, from the first worker start to the job's end."""

    def __init__(self, plan: LaunchPlan, settings: PreemptionPlan, emit: Callable[..., None]) -> None:
        self._plan = plan
        self.settings = settings
        self._emit = emit
        self.notice: Notice | None = None
        self._dir: str | None = None
        self._path: str | None = None
        self._page: Any = None
        self._info: RendezvousInfo | None = None
        self._next_check = 0.0
        self._hurried = False
        self._requeuing = False
        #: A second signal that came while this node asked Slurm to requeue the job (Slurm's own
        #: stop of the requeued step, sent as soon as scontrol returns): held until the outcome is
        #: said; then the agent exits with it (:meth:`launcher.agent.agent.Agent._on_signal`).
        self.exit_after: int | None = None
        self._record: PreemptionRecord | None = None
        if settings.state_dir is not None:  # --preemption-state-dir: our own count across runs
            from launcher.preemption.record import PreemptionRecord

            self._record = PreemptionRecord(settings.state_dir, plan.run_id)

    def is_preemption(self, signum: int | None) -> bool:
        """Whether ``signum`` is one of the signals that mean preemption."""
        return signum in self.settings.signals

    def hurry(self) -> None:
        """A second signal: do not wait out the grace."""
        self._hurried = True

    def holds_exit(self, signum: int) -> bool:
        """In the signal handler, for a second signal once the workers are gone: whether it must
        wait for the requeue's outcome to be said (then :attr:`exit_after` is ``signum``)."""
        if self._requeuing:
            self.exit_after = signum
        return self._requeuing

    # -- while the workers run ----------------------------------------------------------------

    def prepare(self, envs: dict[int, dict[str, str]], info: RendezvousInfo) -> None:
        """Create the notice file (once) and name it in every worker's environment; ``info`` is
        the round whose workers start now (where the other nodes post their notices)."""
        self._info = info
        self._next_check = time.monotonic() + CHECK_INTERVAL
        if self._path is None:
            import mmap

            from launcher.private_dirs import make_private_dir

            self._dir = make_private_dir("launcher_preemption_")
            self._path = os.path.join(self._dir, "notice")
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                os.ftruncate(fd, NOTICE_SIZE)
                self._page = mmap.mmap(fd, NOTICE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
        signals = ",".join(str(n) for n in self.settings.signals)
        count = str(self.continuation())  # a continuation knows it is one
        for env in envs.values():
            env[NOTICE_FILE_ENV] = self._path
            env[NOTICE_SIGNALS_ENV] = signals
            env[PREEMPTION_COUNT_ENV] = count

    def continuation(self) -> int:
        """How many times this job was preempted (or requeued) before this run: Slurm's restart
        count, or launcher's own record (``--preemption-state-dir``), whichever is larger."""
        own = self._record.count if self._record is not None else 0
        return max(preemption_count(os.environ), own)

    def next_due(self) -> float:
        """Seconds until the next look in the store (the agent's selector sleeps no longer)."""
        if self._info is None or self._info.store is None or self._info.group_world_size == 1:
            return 3600.0
        return max(0.0, self._next_check - time.monotonic())

    def poll(self, signum: int | None) -> bool:
        """Whether the job is preempted: ``signum`` (the signal the agent received, if any) is
        a preemption signal, or another node posted its notice (looked for when due)."""
        if self.notice is None and self.is_preemption(signum):
            assert signum is not None
            self.received(signum)
        if self.notice is not None:
            return True
        info = self._info
        if info is None or info.store is None or info.group_world_size == 1 or time.monotonic() < self._next_check:
            return False
        self._next_check = time.monotonic() + CHECK_INTERVAL
        name = key(self._plan.run_id, info.round)
        try:
            if not info.store.check([name]):
                return False
            posted = json.loads(info.store.get(name, timeout=5.0))
        except STORE_FAILURES + (ValueError,) as exc:
            log.debug("cannot look for a preemption notice: %s", exc)
            return False
        self._notify(_signal_number(posted.get("signal")), str(posted.get("node", "?")),
                     _remote_grace(posted.get("deadline"), self.settings.grace), local=False)
        return True

    def received(self, signum: int) -> None:
        """This agent received a preemption signal: tell its workers, then the other nodes."""
        if self.notice is not None:
            return
        self._notify(signum, self._name(), self.settings.grace, local=True)
        self._scheduler_grace(signum)  # after the workers were told: they need not wait for scontrol
        info = self._info
        if info is None or info.store is None or info.group_world_size == 1:
            return
        assert self.notice is not None
        posted = {"node": self._name(), "group_rank": info.group_rank, "signal": signal.Signals(signum).name,
                  "deadline": time.time() + max(0.0, self.notice.deadline - time.monotonic())}
        try:
            info.store.compare_set(key(self._plan.run_id, info.round), b"", json.dumps(posted).encode())
        except STORE_FAILURES as exc:
            log.warning("cannot tell the other nodes about the preemption: %s", exc)

    def _name(self) -> str:
        """This node as the rendezvous names it (host names may repeat: containers, namespaces)."""
        info = self._info
        if info is None or info.group_world_size == 1:
            return self._plan.node
        name = info.participants[info.group_rank] if len(info.participants) > info.group_rank else self._plan.node
        return f"{name} (node {info.group_rank})"

    def _scheduler_grace(self, signum: int) -> None:
        """Shorten the grace to what the scheduler leaves, when it says (Slurm: ``KillWait``, the
        time limit): workers saving past it would be killed mid-save."""
        from launcher.preemption.requeue import slurm_grace

        notice = self.notice
        limit = slurm_grace(signum)
        if notice is None or limit is None or limit[0] >= notice.grace:
            return
        grace, source = limit
        self.notice = dataclasses.replace(notice, deadline=notice.deadline - (notice.grace - grace), grace=grace)
        if self._page is not None:
            FIELDS.pack_into(self._page, FIELDS_OFFSET, self.notice.deadline, signum, notice_group_rank(self._info))
        log.warning("the grace is %s s, not %s s: %s ends the job then", _seconds(grace), _seconds(notice.grace),
                    source)

    def _notify(self, signum: int, node: str, grace: float, *, local: bool) -> None:
        deadline = time.monotonic() + grace
        self.notice = Notice(signum, node, deadline, grace, local)
        if self._page is not None:
            FIELDS.pack_into(self._page, FIELDS_OFFSET, deadline, signum, notice_group_rank(self._info))
            self._page[0] = 1  # last: a worker that sees the flag finds the fields written
        name = signal.Signals(signum).name
        log.warning("preempted (%s %s): every rank is told; workers have %s s to save and exit",
                    name, "received here" if local else f"received by {node}", _seconds(grace))
        self._emit("preempted", signal=name, received_by=node, grace=grace)

    # -- the end -------------------------------------------------------------------------------

    def before_workers(self, signum: int) -> AgentResult:
        """Preempted while no worker ran (in a rendezvous): nothing to save; the job's outcome."""
        name = signal.Signals(signum).name
        self._emit("preempted", signal=name, received_by=self._name(), grace=0.0)
        message = f"node {self._name()}: job preempted ({name} received here) while no worker ran; exit status 75"
        log.warning("%s", message)
        if self._record is not None:
            self._record.preempted(name, self._name())
        return AgentResult(exit_code=PREEMPTED_EXIT, preempted=True, message=message)

    def finish(self, group: WorkerGroup, shutdown_timeout: float) -> AgentResult:
        """Wait for the workers to save and exit within the grace, stop the rest; the job's
        outcome on this node, its message the preemption report."""
        notice = self.notice
        assert notice is not None
        while group.running() and not self._hurried:
            left = notice.deadline - time.monotonic()
            if left <= 0:
                break
            group.wait(min(left, 0.5))
        stragglers = {s.local_rank for s in group.running()}
        if stragglers:
            log.warning("%d worker(s) still running at the end of the %s s grace: sending %s",
                        len(stragglers), _seconds(notice.grace), signal.Signals(notice.signum).name)
            group.stop(notice.signum, shutdown_timeout)
        group.drain_output(group.slots)
        ends = []
        for slot in group.slots:
            process = slot.process
            code = process.returncode if process is not None else None
            ends.append(RankEnd(slot.local_rank, slot.global_rank, process.pid if process is not None else None,
                                code, stopped=slot.local_rank in stragglers))
        report = PreemptionReport(node=self._name(), signal_name=signal.Signals(notice.signum).name,
                                  received_by=notice.node, local=notice.local, grace=notice.grace, ranks=ends)
        # Said before the nodes part: a scheduler may stop the others once the first node exits.
        log.warning("%s", report.render())
        if self._record is not None:  # before the wait: a scheduler may kill this node any moment now
            self._record.preempted(report.signal_name, report.received_by)
        if not self._hurried:  # a node told to stop now does not wait for the others either
            self._wait_for_others()
        message = report.render()
        if self.settings.requeue and (self._info is None or self._info.group_rank == 0):  # one node requeues
            from launcher.preemption.requeue import requeue

            self._requeuing = True
            try:
                outcome = requeue()
                log.warning("%s", outcome)
            finally:
                self._requeuing = False
            message += f"\n{outcome}"
        return AgentResult(exit_code=PREEMPTED_EXIT, preempted=True, message=message)

    def _wait_for_others(self) -> None:
        """Every node says it is done, and waits (bounded) for the others: the node that serves
        the store must not take it away while another node still reads it."""
        info = self._info
        if info is None or info.store is None or info.group_world_size == 1:
            return
        base = key(self._plan.run_id, info.round)
        with contextlib.suppress(*STORE_FAILURES):
            if info.store.add(f"{base}/done", 1) >= info.group_world_size:
                info.store.set(f"{base}/all_done", b"1")
            info.store.wait([f"{base}/all_done"], timeout=DONE_WAIT)

    def close(self, exit_code: int | None = None) -> None:
        """Unmap and remove the notice file; a job that succeeded (``exit_code`` 0) removes its
        preemption record: the next run with its id is a first run."""
        if exit_code == 0 and self._record is not None:
            self._record.succeeded()
        if self._page is not None:
            with contextlib.suppress(Exception):
                self._page.close()
            self._page = None
        if self._dir is not None:
            import shutil

            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def notice_group_rank(info: RendezvousInfo | None) -> int:
    return info.group_rank if info is not None else 0


def _signal_number(name: Any) -> int:
    try:
        return int(signal.Signals[str(name)])
    except KeyError:
        return int(signal.SIGTERM)


def _remote_grace(deadline: Any, grace: float) -> float:
    """This node's grace for another node's notice: what is left of that node's (wall clocks
    of a cluster agree closely), never more than this node's own."""
    try:
        left = float(deadline) - time.time()
    except (TypeError, ValueError):
        return grace
    return max(0.0, min(grace, left))


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


__all__ = ["CHECK_INTERVAL", "Notice", "PreemptionWatch", "key"]
