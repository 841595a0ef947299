"""The agent loop: rendezvous, start workers, watch them, restart or finish.

::

    rendezvous ─► assign ranks ─► start workers ─► watch ─┬─ all succeeded ─► exit barrier ─► done
        ▲                                                  ├─ one failed ─► stop the rest ─► restart? ─┐
        │                                                  ├─ nodes waiting / lost ─► stop ──────────┤
        └──────────────────────────────────────────────────┴───────────────────────────────────────────┘

The agent runs a :class:`~launcher.plan.LaunchPlan` and decides nothing the plan already
decided: every plugin is resolved and every value checked before the agent starts. Worker exits
are noticed at once (exit descriptors in a selector); the rendezvous is asked about waiting or
lost nodes every ``monitor_interval``. A restart after a failure uses up one of
``max_restarts``; re-forming because nodes joined or left does not. Everything the agent opens
(signal handlers, event sinks, the watchdog, the output pump, the rendezvous, the workers) is
owned by one :class:`contextlib.ExitStack` and closed in reverse order, the workers first.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from typing import TYPE_CHECKING, Any

from launcher.agent.attempt import start_attempt
from launcher.agent.environment import worker_environment
from launcher.agent.group import Entrypoint, WorkerGroup, WorkerSlot
from launcher.agent.reporting import NodeReporter
from launcher.agent.restart import RestartTally, announce_restart, restarts_note, stop_failed
from launcher.agent.result import AgentResult, WatchOutcome
from launcher.agent.signals import SignalForwarder, SignalReceived, exit_now, signal_message
from launcher.containment.watchdog import Watchdog
from launcher.errors import LaunchError
from launcher.health.api import EXIT_NODE_SICK
from launcher.health.gate import HealthGate, NodeSick
from launcher.logs.pump import OutputPump
from launcher.plugins.types import finish_logs
from launcher.rendezvous.api import (
    SMALL_ROUND_MAX,
    STORE_FAILURES,
    RendezvousClosedError,
    RendezvousError,
    RendezvousStoreError,
    StoreBackedHandler,
)
from launcher.store.api import StoreError
from launcher.stragglers.settings import monitor_for as straggler_monitor

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.progress import ProgressTracker
    from launcher.events.bus import EventBus
    from launcher.failures.oom import OomWatch
    from launcher.failures.report import RankState, WorkerFailure
    from launcher.hangs.monitor import HangMonitor
    from launcher.hangs.report import HangReport
    from launcher.plan import LaunchPlan
    from launcher.preemption.watch import PreemptionWatch
    from launcher.preload.preload import Preloader
    from launcher.recovery.inplace import InPlaceRecovery
    from launcher.rendezvous.api import RendezvousHandler, RendezvousInfo

log = logging.getLogger("launcher.agent")

#: Seconds between membership checks at the least (see ``Agent._watch``).
MIN_MEMBERSHIP_INTERVAL = 1.0


class Agent:
    """Runs this node's share of a job, as ``plan`` says (see the module docstring)."""

    def __init__(self, plan: LaunchPlan, *, handler: RendezvousHandler | None = None,
                 own_process: bool = False, watchdog: Watchdog | None = None) -> None:
        """``handler`` replaces the one the plan's rendezvous backend would create (tests).
        ``own_process``: this process is the launcher's own (the command line, not the Python API),
        so the job's containment may move it into the job's cgroup or make it a child subreaper
        (:mod:`launcher.containment.containment`). ``watchdog``: one already spawned for this agent (the
        command line spawns it early, :meth:`Watchdog.spawn`); the agent starts and stops it."""
        self._own_process = own_process
        self._watchdog = watchdog
        self.plan = plan
        self.node = plan.node
        self._handler = handler
        self._handler_used: Any = None  # the handler run() created or was given
        self._restart_count = 0
        self._tally = RestartTally()  # _restart_count by kind: in-place recoveries, full restarts
        self._group: WorkerGroup | None = None
        self._result_dir: str | None = None
        self._events: EventBus | None = None
        self._oom_watch: OomWatch | None = None
        #: With --hang-timeout; else None.
        self._hangs: HangMonitor | None = None
        self._signals = SignalForwarder(plan.signals, hurry=self._on_signal)
        #: What the agent is waiting for now, as the line a signal ends it with says it.
        self._phase = "starting"
        #: This node's last round (a node stopped outside the workers' phase tells its others).
        self._info: RendezvousInfo | None = None
        self._report = NodeReporter(plan, self._emit)
        self._preload: Preloader | None = None  # --preload
        self._health = HealthGate(plan, self._emit)  # checks before each round (launcher.health)
        self._status: Any = None  # launcher.status's StatusPublisher, from the first start
        self._preemption: PreemptionWatch | None = None  # --preemption-*: opened in run()
        self._recovery: InPlaceRecovery | None = None  # the workers' control channel (launcher.recovery)
        #: The group an in-place recovery keeps for the next round (launcher.agent.attempt).
        self._kept: WorkerGroup | None = None
        #: --max-no-progress-restarts (launcher.agent.progress): made once the first workers run.
        self._progress: ProgressTracker | None = None

    @property
    def recoveries_in_place(self) -> int:
        """Restarts so far that were in-place recoveries (live workers kept; docs/recovery.md)."""
        return self._tally.in_place

    @property
    def full_restarts(self) -> int:
        """Restarts so far that stopped and started every worker (with recoveries_in_place: _restart_count)."""
        return self._tally.full

    def _emit(self, event_type: str, **data: Any) -> None:
        if self._events is not None:
            self._events.emit(event_type, **data)

    def _on_signal(self, signum: int, first: bool) -> None:
        """In the handler, for a signal the agent's loop will see (see launcher.agent.signals):
        a second one hurries the workers' stop, or ends the agent at once once they are gone."""
        preemption = self._preemption
        graced = preemption is not None and preemption.notice is not None
        if first and not (graced and preemption is not None and not preemption.is_preemption(signum)):
            return  # the loop forwards it (a preemption signal starts the grace there)
        group = self._group
        if group is not None and group.running():
            group.hurry()  # the user will not wait out --shutdown-timeout
            if preemption is not None:  # nor the grace
                preemption.hurry()
        elif not first and self._own_process:  # not a program that embeds the agent (launcher.api)
            if preemption is not None and preemption.holds_exit(signum):
                return  # the requeue's outcome is said first
            exit_now(signum)  # nothing left to stop gracefully
        elif preemption is not None:
            preemption.hurry()

    # -- what the agent owns -----------------------------------------------------------------

    def run(self) -> AgentResult:
        """Run the job on this node to its end; never leaves a worker behind."""
        plan = self.plan
        result = AgentResult(exit_code=1)
        with contextlib.ExitStack() as stack:
            # Closed in reverse order: the workers first, the signal handlers last.
            stack.enter_context(self._signals)
            stack.callback(self._remove_result_dir)
            stack.callback(lambda: self._finish_logs(result.exit_code == 0))
            self._events = plan.events.open()
            stack.callback(self._close_events)
            stack.callback(lambda: self._status.close(result.exit_code) if self._status is not None else None)
            if plan.hangs is not None:
                from launcher.hangs.monitor import HangMonitor

                self._hangs = HangMonitor.for_plan(plan, self._emit)
                stack.callback(self._hangs.close)
                self._hangs.enable_dump_signal(list(plan.signals))  # SIGUSR2: every rank's stacks
            else:  # SIGUSR2 must not kill the agent: it says how to get stacks instead
                from launcher.hangs.ondemand import explain_dump_signal

                stack.callback(explain_dump_signal(list(plan.signals)))
            stack.callback(lambda: self._oom_watch.close() if self._oom_watch is not None else None)
            if plan.preemption is not None:  # its machinery only when a preemption flag asks for it
                from launcher.preemption.watch import PreemptionWatch
                self._preemption = PreemptionWatch(plan, plan.preemption, self._emit)
                stack.callback(lambda: self._preemption.close(result.exit_code) if self._preemption else None)
            self._stragglers = straggler_monitor(plan, self._emit, stack)  # --straggler-detection (launcher.stragglers)
            watchdog = self._watchdog if self._watchdog is not None else Watchdog(own_process=self._own_process)
            stack.callback(watchdog.stop)
            recovery = plan.settings.get("recovery")
            if recovery is None or recovery.in_place:  # one bind and one thread: launcher.recovery.channel
                from launcher.recovery.inplace import InPlaceRecovery
                from launcher.recovery.settings import RecoverySettings

                self._recovery = InPlaceRecovery(recovery or RecoverySettings(), watchdog.token, self._emit,
                                                 lambda: self._signals.received is not None)
                stack.callback(self._recovery.close)
            stack.callback(lambda: self._progress.close() if self._progress is not None else None)
            pump = OutputPump()
            stack.callback(pump.close)
            try:
                if not watchdog.start():
                    log.warning("cannot start the watchdog: workers will die with the agent, their children may not")
                # The first round's health checks run beside what follows, up to the join, which
                # waits for their verdict (launcher.health.gate); in the job's containment from here.
                self._health.job_token = watchdog.token  # the checks' processes carry the job's token
                self._health.start()
                stack.callback(self._health.close)
                # --preload: the template's imports overlap the rendezvous (launcher.preload.preload).
                if plan.workers.preload:
                    from launcher.preload.preload import start_preloader

                    self._preload = start_preloader(plan, watchdog)
                if self._preload is not None:
                    stack.callback(self._preload.close)
                endpoint = plan.rendezvous.parameters.endpoint.strip()
                self._phase = "connecting to the rendezvous store" + (f" at {endpoint}" if endpoint else "")
                with self._signals.interruptible():  # a store nobody serves yet is waited for (join_timeout)
                    handler = self._handler if self._handler is not None else plan.rendezvous.create_handler()
                self._handler_used = handler
                if plan.topology is not None:  # --topology: the location goes in this node's join record
                    if hasattr(handler, "topology"):
                        handler.topology = plan.topology
                    elif plan.rendezvous.parameters.max_nodes == 1:
                        log.info("--topology: this node is at %s (one node: no order to give)", plan.topology)
                    else:
                        log.warning("--topology is ignored: the %s rendezvous backend assigns group ranks itself",
                                    plan.rendezvous.backend.name)
                if plan.segment is not None:  # --segment: the closer takes whole segments (plan checked the backend)
                    if hasattr(handler, "segment"):
                        handler.segment = plan.segment
                    elif plan.rendezvous.parameters.max_nodes > 1:
                        log.warning("--segment is ignored: the %s rendezvous backend assigns group ranks itself",
                                    plan.rendezvous.backend.name)
                if hasattr(handler, "stop_requested"):  # a host serving the others' departure stops too
                    handler.stop_requested = lambda: self._signals.received is not None
                stack.callback(lambda: self._close_rendezvous(handler, result.exit_code))
                stack.callback(self._kill_group)
                stack.callback(lambda: self._health.finish(handler, result, self._report.store_note is None))
                result = self._loop(handler, pump, watchdog)
            except NodeSick as exc:  # a sick node joined nothing, one put out (a straggler) no more: says why
                result = AgentResult(exit_code=exc.exit_code, message=str(exc))
            except SignalReceived as exc:
                result = self._stopped(exc.signum)
            except (RendezvousError, StoreError) as exc:
                from launcher.rendezvous.dynamic import SpareNotNeeded  # only once a rendezvous ended
                from launcher.rendezvous.store_ops import JobEndedForSpare

                report = self._report
                if isinstance(exc, JobEndedForSpare) and self._info is None:
                    # Told by the store, which had refused it, that the job ended: it only waited as a spare.
                    exc = SpareNotNeeded(f"{exc}; this node took part in no round, and was not needed")
                if isinstance(exc, SpareNotNeeded):
                    # A spare has no part in the job: the job's end is no failure of this node.
                    log.warning("%s; exiting 0 (the nodes of the job report how it ended)", exc)
                    result = AgentResult(exit_code=0, message=str(exc))
                else:
                    if isinstance(exc, (StoreError, RendezvousStoreError)) and report.store_note is None:
                        # A store that refuses or cut this node off is not written to on the way out
                        # (each write would wait out a connect timeout); a passing hiccup is.
                        report.note_store_gone(self._handler_used)
                    if report.last_ranks and report.group_rank is not None:
                        report.log_ranks(report.last_ranks)
                    result = AgentResult(exit_code=1, message=f"rendezvous failed: {exc}")
                    self._emit("job_failed", reason=result.message)
        if result.exit_code == 0 and self._signals.received is not None:
            # Stopped after the job had succeeded here (serving the store until the others left).
            result = AgentResult(exit_code=128 + self._signals.received,
                                 message=signal_message(self._signals.received, self._phase))
        return result

    def _stopped(self, signum: int) -> AgentResult:
        """A signal ended a wait (``self._phase``) where no worker ran, or only kept ones (an
        in-place recovery's): they get the signal and ``--shutdown-timeout``; the job's outcome."""
        group = self._group
        if group is not None and group.running():
            log.warning("received %s: forwarding it to %d worker(s)", signal.Signals(signum).name,
                        len(group.running()))
            group.stop(signum, self.plan.shutdown_timeout)
        if self._preemption is not None and self._preemption.is_preemption(signum):
            return self._preemption.before_workers(signum)  # no worker to save: preempted
        info = self._info
        if info is not None and info.group_world_size > 1:  # the other nodes name it (launcher.agent.outcome)
            name = signal.Signals(signum).name
            self._report.publish(info, self._handler_used, self._report.outcome(info,
                                                                                 reason=f"its agent received {name}"))
        self._emit("job_failed", reason=f"agent received {signal.Signals(signum).name}")
        return AgentResult(exit_code=128 + signum, message=signal_message(signum, self._phase))

    def _kill_group(self) -> None:
        if self._group is not None:
            self._group.stop(signal.SIGKILL, 0)
            self._group.close()
            self._group = None

    def _close_rendezvous(self, handler: RendezvousHandler, exit_code: int) -> None:
        signum = self._signals.received
        if exit_code == 0:
            self._phase = "serving the rendezvous store until the other nodes leave"
        if self._report.store_note is not None:
            # Nothing answers there any more: leave without writing to it.
            if isinstance(handler, StoreBackedHandler):
                handler.abandon_store()
        elif signum is not None and exit_code == 128 + signum and callable(getattr(handler, "depart", None)):
            # Stopped: the others learn it from the rendezvous, as when a node is lost, and end
            # (or re-form without this node, when the job can do without it).
            with contextlib.suppress(Exception):
                handler.depart(f"stopped by {signal.Signals(signum).name}")  # type: ignore[attr-defined]
        elif exit_code != EXIT_NODE_SICK:  # a sick node, or one put out, leaves the job open for the others
            with contextlib.suppress(Exception):
                if exit_code != 0 or not handler.is_closed():
                    handler.set_closed()
        with contextlib.suppress(Exception):
            handler.shutdown()

    def _close_events(self) -> None:
        if self._events is not None:
            with contextlib.suppress(Exception):
                self._events.close(timeout=5.0)

    def _finish_logs(self, succeeded: bool) -> None:
        finish_logs(self.plan.logs_specs, succeeded)

    def _remove_result_dir(self) -> None:
        if self._result_dir is not None:
            import shutil
            shutil.rmtree(self._result_dir, ignore_errors=True)
            self._result_dir = None

    # -- the loop ----------------------------------------------------------------------------

    def _rendezvous(self, handler: RendezvousHandler) -> RendezvousInfo:
        self._phase = "running the health checks"
        with self._signals.interruptible():  # a signal ends the checks' wait and the round's alike
            self._health.verdict(handler)  # the checks' answer (started now if not yet): a sick node raises NodeSick
            self._stragglers.before_join(handler)  # a node put out as a straggler raises NodeExcluded
            started = time.monotonic()
            self._emit("rendezvous_started", restart_count=self._restart_count)
            self._phase = "waiting for the other nodes in the rendezvous" + (
                " (the workers kept for an in-place recovery)" if self._kept is not None else "")
            info = handler.next_rendezvous()
        self._info = info
        self._phase = "starting the workers"
        self._stragglers.after_join(handler)  # a spare called in names the straggler it replaces
        listed: dict[str, list[str]] = {}
        if info.group_world_size <= SMALL_ROUND_MAX:  # larger: O(N) bytes a node to list them
            with contextlib.suppress(*STORE_FAILURES):  # read from the store now
                listed["participants"] = list(info.participants)
        self._emit("rendezvous_completed", round=info.round, group_rank=info.group_rank,
                   group_world_size=info.group_world_size, **listed, duration=round(time.monotonic() - started, 6))
        return info

    def _loop(self, handler: RendezvousHandler, pump: OutputPump, watchdog: Watchdog) -> AgentResult:
        plan, report = self.plan, self._report
        remaining_restarts = plan.max_restarts
        previous: RendezvousInfo | None = None
        #: Set when the last restart followed a worker failure (it may be refunded, see below).
        charged = False
        #: The failure this node is restarting after: reported if the job is closed meanwhile
        #: (a node of the old round finished as this one failed, see launcher.agent.finished).
        pending: tuple[RendezvousInfo, list[WorkerFailure], list[RankState]] | None = None
        while True:
            try:
                info = self._rendezvous(handler)
            except (RendezvousError, StoreError) as exc:
                absorbed = self._finished_without_this_node(handler, exc, previous)
                if absorbed is not None:
                    return absorbed
                if pending is None:
                    raise
                from launcher.agent.membership import restart_closed

                return restart_closed(report, handler, *pending, exc, self._emit, plan.run_id, self._oom_watch)
            pending = None
            report.pending_hang = None
            if previous is not None:
                from launcher.agent.membership import lost_since, named  # only after a re-form

                names, unnamed = lost_since(previous, info)
                left = named(handler, names) + (f" and {unnamed} more" if unnamed else "")
                if left and charged:
                    # The failure that used a restart came from a node leaving (peers' collectives
                    # break before heartbeats time out): re-forming costs no restart.
                    log.warning("node(s) %s left the job: the last restart is not counted", left)
                    remaining_restarts += 1
                    self._restart_count -= 1
                    self._tally.refund()
                elif left:
                    # Said on every node: one that re-formed only because its peers did (their
                    # stop broke its workers' collectives) has not named the departed nodes yet.
                    log.info("node(s) %s left the job; the group re-formed without them", left)
            charged = False
            previous = info
            report.joined(info, handler)
            try:
                group = start_attempt(self, info, pump, watchdog)
            except LaunchError as exc:
                if self._progress is None or exc is not self._progress.verdict:
                    raise
                from launcher.agent.progress import end_job

                return end_job(self, self._progress.verdict)  # the restarts made no progress
            if self._progress is None and plan.settings.get("progress", 1):  # off the first start's path
                from launcher.agent.progress import tracker_for

                self._progress = tracker_for(plan, watchdog.token)
            self._health.poll(handler)  # nodes kept out by health checks, named once the workers run
            # Loaded once the workers run: off the path to their first start.
            from launcher.agent.barrier import exit_barrier
            from launcher.agent.membership import (
                arm_death_notice,
                await_lost_nodes,
                cannot_reform,
                reform_blocked,
                regrouping_for_joiners,
            )
            from launcher.status.publisher import StatusPublisher

            self._status = self._status or StatusPublisher(plan, self._hangs, stragglers=self._stragglers,
                                                           health=self._health)
            self._status.attach(group, info, self._restart_count, self.recoveries_in_place, handler)

            arm_death_notice(handler, watchdog)
            self._phase = "running the workers"
            outcome, failed = self._watch(group, handler, info)
            if outcome is WatchOutcome.SIGNAL:
                return self._forward_signal(info, handler, group)
            if outcome is WatchOutcome.PREEMPTED and self._preemption is not None:
                result = self._preemption.finish(group, plan.shutdown_timeout)
                if self._preemption.exit_after is not None:  # came during the requeue, which is said now
                    exit_now(self._preemption.exit_after)
                self._close_group(group)
                return result
            if outcome is WatchOutcome.SUCCEEDED:
                ranks = report.rank_states(group, ())
                self._close_group(group)
                values = group.return_values() if plan.entry.function is not None else {}
                # A signal ends the wait for the other nodes at once (up to --exit-barrier-timeout).
                self._phase = "waiting for the other nodes to finish (every worker of this node had succeeded)"
                with self._signals.interruptible():
                    unfinished = exit_barrier(info, handler, report, run_id=plan.run_id,
                                              timeout=plan.exit_barrier_timeout, ranks=ranks)
                if unfinished is not None:  # the job cannot finish any more (see launcher.agent.barrier)
                    self._emit("job_failed", reason=unfinished.message or "the job failed on another node")
                    return unfinished
                if self._restart_count:
                    log.warning("job succeeded on this node; %s", restarts_note(self._tally, plan.max_restarts))
                self._emit("job_succeeded", restart_count=self._restart_count,
                           in_place_recoveries=self.recoveries_in_place)
                return AgentResult(exit_code=0, return_values=values)
            if outcome is WatchOutcome.MEMBERSHIP:
                kept = self._recover_in_place(group, [], info, handler, None)
                if isinstance(kept, AgentResult):
                    return kept
                if kept is not None:
                    continue  # re-formed in place: no restart counted
            if outcome is WatchOutcome.MEMBERSHIP:
                killed = {s.local_rank for s in group.running()}
                group.stop(signal.SIGTERM, plan.shutdown_timeout)
                # Shown if the job then ends in the rendezvous (too few nodes left, say).
                report.last_ranks = report.rank_states(group, killed)
                self._close_group(group)
                finished = reform_blocked(info, handler, report, plan.run_id, [])
                if finished:
                    return cannot_reform(info, handler, report, finished, [], report.last_ranks, self._emit,
                                         what="re-forming the group")
                continue
            if outcome in (WatchOutcome.CLOSED, WatchOutcome.STORE_GONE):
                return self._ended_elsewhere(info, handler, group, outcome)
            # A worker failed (or hung: the hang report is printed before the group is stopped).
            hang = self._hangs.report if outcome is WatchOutcome.HUNG and self._hangs is not None else None
            if hang is not None and self._hangs is not None:
                from launcher.hangs.report import hang_outcome

                in_place = self._recovery is not None and self._recovery.can_recover(group, remaining_restarts)
                self._hangs.announce(hang_outcome(remaining_restarts, plan.max_restarts, in_place=in_place))
            multi = info.group_world_size > 1
            if self._recovery is not None:
                kept = self._recover_in_place(group, failed, info, handler, remaining_restarts, hang)
                if isinstance(kept, AgentResult):
                    return kept
                if kept is not None:
                    remaining_restarts -= 1
                    self._restart_count += 1
                    self._tally.charge(in_place=True)
                    charged = True
                    self._recovery.record(group, self._restart_count, remaining_restarts, plan.max_restarts, hang)
                    pending = (info, kept[0], kept[1]) if multi else None
                    report.pending_hang = hang if multi else None  # reported if the restart cannot happen
                    continue
            failures, ranks = self._stop_failed(group, failed)
            if self._hangs is not None:
                self._hangs.detach()
            # A node of this round that finished joins no other: restarting or re-forming would
            # wait for it forever (launcher.agent.finished). The claim comes first, see there.
            could_reform = remaining_restarts > 0 or (multi and hang is None)
            finished = reform_blocked(info, handler, report, plan.run_id, failures) if multi and could_reform else []
            if finished:
                return cannot_reform(info, handler, report, finished, failures, ranks, self._emit, hang=hang,
                                     oom_watch=self._oom_watch,
                                     what="a restart" if remaining_restarts > 0 else None)
            pending = (info, failures, ranks) if multi else None
            report.pending_hang = hang if multi else None  # reported if the restart cannot happen
            if hang is None and multi and await_lost_nodes(handler, plan, self._emit, info, grace=0.0):
                continue  # a node another node already found lost broke the collectives: no restart counted
            if hang is None and multi and regrouping_for_joiners(handler, self._emit):
                continue
            if remaining_restarts == 0 and multi:
                self._phase = "waiting to learn whether a lost node made the workers fail"
                with self._signals.interruptible():  # up to the heartbeat timeout
                    if await_lost_nodes(handler, plan, self._emit, info):
                        continue  # a node left: re-form without counting a restart
            if remaining_restarts > 0:
                remaining_restarts -= 1
                self._restart_count += 1
                self._tally.charge(in_place=False)
                charged = True
                announce_restart(failures, hang, self._restart_count, remaining_restarts, plan.max_restarts, self._emit,
                                 self._recovery.fallback if self._recovery is not None else None)
                continue
            note = restarts_note(self._tally, plan.max_restarts)
            result = report.job_failed(info, handler, failures, ranks, closer=True, hang=hang,
                                       oom_watch=self._oom_watch, notes=[note] if note else [])
            self._emit("job_failed", reason="hang" if hang is not None else "worker failure", failures=len(failures))
            return result

    def _finished_without_this_node(self, handler: RendezvousHandler, exc: BaseException,
                                    previous: RendezvousInfo | None) -> AgentResult | None:
        """Exit 0 when the job was closed because it finished on every node of a round this node
        was left out of (it re-formed too late, after its worker failed or hung, or after it was
        cut off and came back): the job absorbed this node's trouble, and a scheduler must not
        count the finished job as failed because of it. ``None`` otherwise."""
        if previous is None or not isinstance(exc, RendezvousClosedError):
            return None
        from launcher.agent.finished import await_final_round_left, job_succeeded

        final = job_succeeded(handler, self.plan.run_id)
        if final is None or final <= previous.round:
            return None
        message = (f"the job finished in round {final} without this node (it took part up to round "
                   f"{previous.round}; what happened to it there was absorbed by the job)")
        log.warning("%s; exiting 0", message)
        # This node may serve the store (c10d's host): the round's nodes are still leaving it.
        await_final_round_left(handler, self.plan.run_id, final, min(self.plan.exit_barrier_timeout, 30.0))
        self._emit("job_succeeded", restart_count=self._restart_count, in_place_recoveries=self.recoveries_in_place)
        return AgentResult(exit_code=0, message=message)

    def _recover_in_place(self, group: WorkerGroup, failed: list[WorkerSlot], info: RendezvousInfo,
                          handler: RendezvousHandler, restarts_left: int | None, hang: HangReport | None = None
                          ) -> tuple[list[WorkerFailure], list[RankState]] | AgentResult | None:
        """Keep ``group`` for the next round if its workers can recover in place
        (:mod:`launcher.recovery.inplace`): then the failures of the dead workers and every rank's
        state (for a report if the next round cannot form); ``None`` when not (a full restart or
        re-form follows); the job's end when a node of this round finished (no new round can form).
        ``restarts_left`` is ``None`` for a re-form, which costs no restart."""
        if self._recovery is None or not self._recovery.leave(
                group, failed, restarts_left=1 if restarts_left is None else restarts_left,
                unsupported="--hang-watch output" if self._hangs is not None and self._hangs.output else None):
            return None
        if self._hangs is not None:
            self._hangs.detach()  # the next round's heartbeat file replaces this one
        from launcher.agent.membership import cannot_reform, reform_blocked

        report = self._report
        failures = report.failures(group, [s for s in failed if s.process is not None and s.process.poll() is not None])
        ranks = report.rank_states(group, ())
        finished = reform_blocked(info, handler, report, self.plan.run_id, failures)
        if finished:  # same as after a restart's stop (launcher.agent.finished)
            self._recovery.dismiss(group)
            failures, ranks = self._stop_failed(group, failed)
            return cannot_reform(info, handler, report, finished, failures, ranks, self._emit, hang=hang,
                                 oom_watch=self._oom_watch, what="an in-place recovery")
        if restarts_left is None:
            log.info("re-forming the group in place: every local worker keeps its process")
        self._kept = group  # the next round resumes it (launcher.agent.attempt)
        return failures, ranks

    def _close_group(self, group: WorkerGroup) -> None:
        group.close()
        self._group = None

    def _stop_failed(self, group: WorkerGroup,
                     failed: list[WorkerSlot] | None) -> tuple[list[WorkerFailure], list[RankState]]:
        result = stop_failed(group, failed, self.plan.shutdown_timeout, self._report)
        self._group = None
        return result

    def _forward_signal(self, info: RendezvousInfo, handler: RendezvousHandler, group: WorkerGroup) -> AgentResult:
        signum = self._signals.received
        assert signum is not None
        name = signal.Signals(signum).name
        log.warning("received %s: forwarding it to %d worker(s)", name, len(group.running()))
        # Said before the rendezvous closes (in run()), so the other nodes can say why.
        self._report.publish(info, handler, self._report.outcome(info, reason=f"its agent received {name}"))
        group.stop(signum, self.plan.shutdown_timeout)
        self._close_group(group)
        self._emit("job_failed", reason=f"agent received {name}")
        return AgentResult(exit_code=128 + signum, message=signal_message(signum))

    def _ended_elsewhere(self, info: RendezvousInfo, handler: RendezvousHandler, group: WorkerGroup,
                         outcome: WatchOutcome) -> AgentResult:
        """Another node ended the job, or the rendezvous store is gone: stop and report."""
        if outcome is WatchOutcome.CLOSED:
            # Written before stopping: a node that failed waits for this record.
            self._report.publish(info, handler, self._report.outcome(info))
        failures, ranks = self._stop_failed(group, None)
        result = self._report.job_failed(info, handler, failures, ranks, closer=False, oom_watch=self._oom_watch)
        self._emit("job_failed", reason=result.message or "ended by another node")
        return result

    def _watch(self, group: WorkerGroup, handler: RendezvousHandler,
               info: RendezvousInfo) -> tuple[WatchOutcome, list[WorkerSlot]]:
        """Block until the group needs attention (see :class:`~launcher.agent.result.WatchOutcome`;
        for ``HUNG`` the report is in ``self._hangs.report``), with the slots that failed or hung."""
        # Exits are seen at once; the interval paces store reads (>= 1 s: thousands of nodes would swamp it).
        from launcher.agent.membership import membership_changed  # loaded once the workers run

        interval = max(self.plan.monitor_interval, MIN_MEMBERSHIP_INTERVAL)
        next_check = time.monotonic() + interval
        preemption = self._preemption
        while True:
            if preemption is not None and preemption.poll(self._signals.received):
                return WatchOutcome.PREEMPTED, []
            if self._signals.received is not None:
                return WatchOutcome.SIGNAL, []
            pause = min(interval, next_check - time.monotonic())
            if self._hangs is not None:
                pause = min(pause, self._hangs.next_due())
            if preemption is not None:
                pause = min(pause, preemption.next_due())
            ended = group.wait(max(0.0, pause))
            if preemption is not None and preemption.poll(self._signals.received):
                return WatchOutcome.PREEMPTED, []  # workers that ended meanwhile were saving, not failing
            failed = [s for s in ended if s.process is not None and s.process.returncode != 0]
            if self._recovery is not None:  # a worker whose function raised waits in launcher.recoverable
                failed = self._recovery.failed(group, failed)
            if failed:
                # Collect every worker that already failed, so the root cause is the earliest.
                failed += [
                    s for s in group.slots
                    if s not in failed and s.process is not None and s.process.poll() not in (None, 0)
                ]
                return WatchOutcome.FAILED, failed
            if group.all_done():
                # A worker that failed after wait() returned (its exit not in `ended`) is still a failure.
                late = [s for s in group.slots if s.process is not None and s.process.returncode != 0]
                return (WatchOutcome.FAILED, late) if late else (WatchOutcome.SUCCEEDED, [])
            if self._hangs is not None and self._hangs.poll() is not None:
                return WatchOutcome.HUNG, self._hangs.hung_slots()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + interval
                self._stragglers.act(handler, info)  # --straggler-action exclude (launcher.stragglers.exclusion)
                try:
                    with self._signals.interruptible():  # a store that went away is retried for seconds
                        change = membership_changed(handler, self._report, self._emit, info)
                except SignalReceived:
                    # The workers run: the signal is handled as one between checks (the loop's top),
                    # a preemption notice included, not as one where no worker ran.
                    continue
                if change is not WatchOutcome.STORE_GONE:  # after the check: a cut-off store is not waited for twice
                    self._health.poll(handler)
                if change is not None:
                    return change, []


__all__ = ["Agent", "AgentResult", "Entrypoint", "LaunchError", "SignalReceived", "WatchOutcome", "worker_environment"]
