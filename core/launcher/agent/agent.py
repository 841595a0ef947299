"""The agent loop: rendezvous, start workers, watch them, restart or finish.

::

    rendezvous ─► assign ranks ─► start workers ─► watch ─┬─ all succeeded ─► exit barrier ─► done
        ▲                                                  ├─ one failed ─► stop the rest ─► restart? ─┐
        │                                                  ├─ nodes waiting / lost ─► stop ──────────┤
        └──────────────────────────────────────────────────┴───────────────────────────────────────────┘

Worker exits are noticed at once (exit descriptors in a selector); the rendezvous is asked about
waiting or lost nodes every ``monitor_interval``. A restart after a failure uses up one of
``max_restarts``; re-forming because nodes joined or left does not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.agent.group import Entrypoint, WorkerGroup, WorkerSlot
from launcher.agent.ranks import assign_ranks
from launcher.agent.watchdog import Watchdog
from launcher.errors import LaunchError
from launcher.logs.pump import OutputPump
from launcher.rendezvous.api import FixedMembership, RendezvousError
from launcher.store.api import StoreError, StoreTimeoutError

if TYPE_CHECKING:  # pragma: no cover
    from launcher.config import LaunchConfig
    from launcher.plugins.manager import LauncherPluginManager
    from launcher.plugins.types import DeviceProvider
    from launcher.rendezvous.api import RendezvousHandler, RendezvousInfo

log = logging.getLogger("launcher.agent")


#: Seconds between membership checks at the least (see ``Agent._watch``).
MIN_MEMBERSHIP_INTERVAL = 1.0


class SignalReceived(Exception):
    """The agent received one of the signals it handles."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class AgentResult:
    """How the job ended on this node."""

    exit_code: int
    #: Return values of function entrypoints, by global rank.
    return_values: dict[int, Any] = field(default_factory=dict)
    failures: list[Any] = field(default_factory=list)
    report: Any = None
    message: str = ""


def worker_environment(
    config: LaunchConfig,
    info: RendezvousInfo,
    slot_ranks: tuple[int, int, int],
    world: tuple[int, int],
    restart_count: int,
    base_env: dict[str, str],
) -> dict[str, str]:
    """The environment one worker gets: exactly torchrun's variables on top of the agent's."""
    local_rank, global_rank, role_rank = slot_ranks
    world_size, role_world_size = world
    env = dict(base_env)
    env.update(config.worker_env)
    env.update(
        {
            "LOCAL_RANK": str(local_rank),
            "RANK": str(global_rank),
            "GROUP_RANK": str(info.group_rank),
            "ROLE_RANK": str(role_rank),
            "ROLE_NAME": config.role,
            "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
            "WORLD_SIZE": str(world_size),
            "GROUP_WORLD_SIZE": str(info.group_world_size),
            "ROLE_WORLD_SIZE": str(role_world_size),
            "MASTER_ADDR": info.master_addr,
            "MASTER_PORT": str(info.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
            "TORCHELASTIC_RUN_ID": config.run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(info.use_agent_store),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": base_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            # torchrun exports this in its own environment, so its workers inherit it.
            "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(s.strip() for s in config.signals_to_handle),
        }
    )
    return env


class Agent:
    """Runs this node's share of a job (see the module docstring)."""

    def __init__(
        self,
        config: LaunchConfig,
        entry: Entrypoint,
        manager: LauncherPluginManager,
        *,
        device_provider: DeviceProvider | None = None,
        handler: RendezvousHandler | None = None,
    ) -> None:
        self.config = config
        self.entry = entry
        self.manager = manager
        self.device_provider = device_provider
        self.node = socket.gethostname()
        self._handler = handler
        self._restart_count = 0
        self._signal: int | None = None
        self._in_rendezvous = False
        self._group: WorkerGroup | None = None
        self._result_dir: str | None = None
        self._events: Any = None
        self._oom_watch: Any = None
        #: launcher.hangs.monitor.HangMonitor with --hang-timeout, else None.
        self._hangs: Any = None
        self._wakeup_r: int | None = None
        self._wakeup_w: int | None = None
        self._previous_wakeup_fd = -1
        #: Set when the rendezvous store stopped answering while workers ran (one line).
        self._store_note: str | None = None
        #: This node's group rank and address in a multi-node job (None on a single node).
        self._group_rank: int | None = None
        #: This node's ranks when the workers were last stopped to re-form the group.
        self._last_ranks: list[Any] = []
        self._node_addr: str | None = None

    # -- set-up helpers ----------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            log.debug("not on the main thread: signals are not forwarded")
            return previous

        def on_signal(signum: int, _frame: Any) -> None:
            first = self._signal is None
            self._signal = signum
            if first and self._in_rendezvous:
                raise SignalReceived(signum)
            if not first and self._group is not None:
                # A second Ctrl-C or SIGTERM: the user will not wait out --shutdown-timeout.
                self._group.hurry()

        # The C-level handler writes to this pipe the instant a signal arrives, waking the
        # agent's selector; the Python handler below then only records which signal it was.
        self._wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(self._wakeup_r, False)
        os.set_blocking(wakeup_w, False)
        self._wakeup_w = wakeup_w
        self._previous_wakeup_fd = signal.set_wakeup_fd(wakeup_w, warn_on_full_buffer=False)
        for signum in self.config.signal_numbers:
            if signal.getsignal(signum) is signal.SIG_IGN:
                # Ignored by whoever started us (nohup ignores SIGHUP, a background job SIGINT):
                # keep ignoring it rather than forward a hang-up the user asked to survive.
                log.info("%s is ignored by the parent; not forwarding it", signal.Signals(signum).name)
                continue
            with contextlib.suppress(OSError, ValueError):
                previous[signum] = signal.signal(signum, on_signal)
        return previous

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if "OMP_NUM_THREADS" not in env and self.config.nproc_per_node > 1:
            log.warning(
                "setting OMP_NUM_THREADS=1 for each worker so %d workers do not oversubscribe the CPUs; "
                "set OMP_NUM_THREADS to tune it",
                self.config.nproc_per_node,
            )
            env["OMP_NUM_THREADS"] = "1"
        return env

    def _emit(self, event_type: str, **data: Any) -> None:
        if self._events is not None:
            self._events.emit(event_type, **data)

    def _plan_cpus(self) -> list[frozenset[int] | None] | None:
        if not self.config.numa_binding:
            return None
        from launcher.numa import plan_affinity

        plan = plan_affinity(
            self.config.numa_binding,
            self.config.nproc_per_node,
            self.device_provider,
            self.manager,
            on_failure="error" if self.config.numa_fallback == "error" else "warn",
        )
        if plan is None:
            return None
        for rank, cpus in enumerate(plan):
            log.info("local rank %d bound to CPUs %s", rank, _cpu_list(cpus))
        return list(plan)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> AgentResult:
        """Run the job on this node to its end; never leaves a worker behind."""
        from launcher.events.bus import create_event_bus
        from launcher.events.model import SinkContext
        from launcher.logs.select import create_logs_specs
        from launcher.rendezvous.registry import create_rendezvous_handler

        config = self.config
        # Everything that can reject the configuration comes first, before anything needs undoing.
        logs_specs = create_logs_specs(config, self.manager)
        cpus = self._plan_cpus()
        self._events = create_event_bus(
            config.event_log_handlers,
            self.manager,
            SinkContext(run_id=config.run_id, node=self.node, role=config.role),
        )
        if config.hang_timeout:
            from launcher.hangs.monitor import HangMonitor

            self._hangs = HangMonitor.create(
                config, self.node, emit=self._emit,
                log_dir=lambda: (getattr(logs_specs, "run_log_dir", None) if config.log_dir else None),
            )
        previous_handlers: dict[int, Any] = {}
        pump = OutputPump()
        watchdog = Watchdog()
        handler = self._handler
        result = AgentResult(exit_code=1)
        try:
            previous_handlers = self._install_signal_handlers()
            if self._hangs is not None:  # SIGUSR2: every local rank's stacks, on demand
                self._hangs.enable_dump_signal(config.signal_numbers)
            if not watchdog.start():
                log.warning("cannot start the watchdog: workers will die with the agent, their children may not")
            base_env = self._base_env()
            if handler is None:
                handler = create_rendezvous_handler(config, self.manager)
            result = self._loop(handler, logs_specs, pump, watchdog, base_env, cpus)
        except SignalReceived as exc:
            result = AgentResult(exit_code=128 + exc.signum, message=_signal_message(exc.signum))
        except (RendezvousError, StoreError) as exc:
            if self._last_ranks and self._group_rank is not None:
                self._log_ranks(self._last_ranks)
            result = AgentResult(exit_code=1, message=f"rendezvous failed: {exc}")
            self._emit("job_failed", reason=result.message)
        finally:
            if self._group is not None:
                self._group.stop(signal.SIGKILL, 0)
                self._group.close()
            if handler is not None:
                if self._store_note is not None:
                    # Nothing answers there any more: leave without writing to it.
                    abandon = getattr(handler, "abandon_store", None)
                    if abandon is not None:
                        abandon()
                else:
                    with contextlib.suppress(Exception):
                        if result.exit_code != 0 or not handler.is_closed():
                            handler.set_closed()
                with contextlib.suppress(Exception):
                    handler.shutdown()
            pump.close()
            watchdog.stop()
            if self._oom_watch is not None:
                self._oom_watch.close()
            if self._hangs is not None:
                self._hangs.close()
            with contextlib.suppress(Exception):
                self._events.close(timeout=5.0)
            finish = getattr(logs_specs, "finish", None)
            if finish is not None:
                finish(result.exit_code == 0)
            if self._result_dir is not None:
                import shutil

                shutil.rmtree(self._result_dir, ignore_errors=True)
            for signum, old in previous_handlers.items():
                with contextlib.suppress(OSError, ValueError, TypeError):
                    signal.signal(signum, old)
            if self._wakeup_r is not None and self._wakeup_w is not None:
                with contextlib.suppress(ValueError):
                    signal.set_wakeup_fd(self._previous_wakeup_fd)
                os.close(self._wakeup_r)
                os.close(self._wakeup_w)
                self._wakeup_r = self._wakeup_w = None
        return result

    def _rendezvous(self, handler: RendezvousHandler) -> RendezvousInfo:
        started = time.monotonic()
        self._emit("rendezvous_started", restart_count=self._restart_count)
        self._in_rendezvous = True
        try:
            if self._signal is not None:
                raise SignalReceived(self._signal)
            info = handler.next_rendezvous()
        finally:
            self._in_rendezvous = False
        self._emit(
            "rendezvous_completed",
            round=info.round,
            group_rank=info.group_rank,
            group_world_size=info.group_world_size,
            participants=list(info.participants),
            duration=round(time.monotonic() - started, 6),
        )
        return info

    def _loop(self, handler: RendezvousHandler, logs_specs: Any, pump: OutputPump, watchdog: Watchdog,
              base_env: dict[str, str], cpus: list[frozenset[int] | None] | None) -> AgentResult:
        config = self.config
        remaining_restarts = config.max_restarts
        previous: RendezvousInfo | None = None
        #: Set when the last restart followed a worker failure (it may be refunded, see below).
        charged = False
        while True:
            info = self._rendezvous(handler)
            if charged and previous is not None and _lost_since(previous, info):
                # The failure that used a restart came from a node leaving (peers' collectives
                # break before heartbeats time out): re-forming costs no restart.
                lost = ", ".join(sorted(_lost_since(previous, info)))
                log.warning("node(s) %s left the job: the last restart is not counted", lost)
                remaining_restarts += 1
                self._restart_count -= 1
            charged = False
            previous = info
            if info.group_world_size > 1:
                self._group_rank = info.group_rank
                descriptor = getattr(handler, "node", None)
                self._node_addr = config.local_addr or getattr(descriptor, "addr", None)
            group = self._start(info, logs_specs, pump, watchdog, base_env, cpus)
            outcome, failed = self._watch(group, handler)
            if outcome == "signal":
                assert self._signal is not None
                signum = self._signal
                log.warning("received %s: forwarding it to %d worker(s)", signal.Signals(signum).name,
                            len(group.running()))
                # Said before the rendezvous closes (in run()), so the other nodes can say why.
                self._publish(info, handler, self._outcome(info, reason=f"its agent received "
                                                                         f"{signal.Signals(signum).name}"))
                group.stop(signum, config.shutdown_timeout)
                group.close()
                self._group = None
                self._emit("job_failed", reason=f"agent received {signal.Signals(signum).name}")
                return AgentResult(exit_code=128 + signum, message=_signal_message(signum))
            if outcome == "succeeded":
                group.close()
                self._group = None
                values = self._return_values(group)
                self._exit_barrier(info, handler)
                self._emit("job_succeeded", restart_count=self._restart_count)
                return AgentResult(exit_code=0, return_values=values)
            if outcome == "membership":
                killed = {s.local_rank for s in group.running()}
                group.stop(signal.SIGTERM, config.shutdown_timeout)
                # Shown if the job then ends in the rendezvous (too few nodes left, say).
                self._last_ranks = self._rank_states(group, killed)
                group.close()
                self._group = None
                continue
            if outcome in ("closed", "store"):
                if outcome == "closed":
                    # Written before stopping: a node that failed waits for this record.
                    self._publish(info, handler, self._outcome(info))
                killed = {s.local_rank for s in group.running()}
                group.stop(signal.SIGTERM, config.shutdown_timeout)
                group.drain_output(group.slots)
                failures = self._failures(group, [s for s in group.slots if s.local_rank not in killed
                                                  and s.process is not None and s.process.returncode])
                ranks = self._rank_states(group, killed)
                group.close()
                self._group = None
                result = self._job_failed(info, handler, failures, ranks, logs_specs, closer=False)
                self._emit("job_failed", reason=result.message or "ended by another node")
                return result
            # A worker failed (or hung: the hang report is printed before the group is stopped).
            hang = self._hangs.report if outcome == "hung" else None
            if hang is not None:
                self._hangs.announce(_hang_outcome(remaining_restarts, config.max_restarts))
            killed = {s.local_rank for s in group.running()}
            group.stop(signal.SIGTERM, config.shutdown_timeout)
            group.drain_output(group.slots)
            failures = self._failures(group, failed)
            ranks = self._rank_states(group, killed)
            group.close()
            self._group = None
            if self._hangs is not None:
                self._hangs.detach()
            if remaining_restarts == 0 and info.group_world_size > 1 and self._await_lost_nodes(handler):
                continue  # a node left: re-form without counting a restart
            if remaining_restarts > 0:
                remaining_restarts -= 1
                self._restart_count += 1
                charged = True
                first = failures[0]
                reason = f"local rank {first.local_rank} (pid {first.pid}) {_describe_exit(first)}"
                if hang is not None:
                    reason = f"{hang.reason} (detected by {hang.detected_by})"
                log.warning("worker group %s: %s; restarting (%d of %d restarts left)",
                            "hung" if hang is not None else "failed", reason, remaining_restarts,
                            config.max_restarts)
                self._emit("group_restarted", count=self._restart_count, reason=reason,
                           cause="hang" if hang is not None else "failure")
                continue
            result = self._job_failed(info, handler, failures, ranks, logs_specs, closer=True, hang=hang)
            self._emit("job_failed", reason="hang" if hang is not None else "worker failure", failures=len(failures))
            return result

    def _start(self, info: RendezvousInfo, logs_specs: Any, pump: OutputPump, watchdog: Watchdog,
               base_env: dict[str, str], cpus: list[frozenset[int] | None] | None) -> WorkerGroup:
        config = self.config
        ranks = assign_ranks(
            info.store,
            f"launcher/{config.run_id}/ranks/{info.round}",
            info.group_rank,
            info.group_world_size,
            config.role,
            config.nproc_per_node,
            timeout=max(60.0, config.exit_barrier_timeout),
        )
        slots = []
        envs: dict[int, dict[str, str]] = {}
        for local_rank in range(config.nproc_per_node):
            env = worker_environment(
                config,
                info,
                (local_rank, ranks.base_rank + local_rank, ranks.base_role_rank + local_rank),
                (ranks.world_size, ranks.role_world_size),
                self._restart_count,
                base_env,
            )
            if config.virtual_local_rank:
                from launcher.devices import virtual_local_rank_env

                env.update(virtual_local_rank_env(self.device_provider, local_rank, base_env))
            envs[local_rank] = env
            slots.append(WorkerSlot(local_rank, ranks.base_rank + local_rank, ranks.base_role_rank + local_rank, env))
        dest = logs_specs.reify(envs)
        if self._hangs is not None:
            self._hangs.prepare(envs, slots)
        for slot in slots:  # reify may have added TORCHELASTIC_ERROR_FILE
            slot.env = envs[slot.local_rank]
        if self.entry.function is not None and self._result_dir is None:
            import tempfile

            self._result_dir = tempfile.mkdtemp(prefix="launcher_results_")
        group = WorkerGroup(slots, pump, watchdog, wakeup_fd=self._wakeup_r)
        self._group = group
        try:
            group.start(
                self.entry,
                dest,
                role=config.role,
                prefix_template=config.log_line_prefix_template,
                stdout_filters=config.duplicate_stdout_filters,
                stderr_filters=config.duplicate_stderr_filters,
                cpus=cpus,
                start_method=config.start_method,
                result_dir=self._result_dir or "",
                worker_tty=config.worker_tty,
            )
        except OSError as exc:
            # EMFILE from pipe(), EAGAIN from fork(): one line, not a traceback.
            from launcher.limits import ResourceLimitError, describe_spawn_error

            message = describe_spawn_error(exc, config.nproc_per_node)
            if message is None:
                raise
            # Stop the workers already started here, with time to die, so that run()'s final
            # SIGKILL finds none and the message stays the only line.
            group.stop(signal.SIGKILL, 5.0)
            raise ResourceLimitError(f"node {self.node}: {message}") from None
        if self._hangs is not None:
            self._hangs.attach(group, info)
        # Taken once the workers are on their way, to keep it off the start-up path.
        if self._oom_watch is None:
            from launcher.failures.oom import OomWatch

            self._oom_watch = OomWatch()
        self._oom_watch.snapshot()
        self._emit(
            "workers_started",
            restart_count=self._restart_count,
            group_rank=info.group_rank,
            workers=[
                {
                    "local_rank": s.local_rank,
                    "rank": s.global_rank,
                    "pid": s.process.pid if s.process else None,
                    "cpus": _cpu_list(cpus[s.local_rank]) if cpus and cpus[s.local_rank] else None,
                }
                for s in slots
            ],
        )
        return group

    def _watch(self, group: WorkerGroup, handler: RendezvousHandler) -> tuple[str, list[WorkerSlot]]:
        """Block until the group needs attention: ``succeeded``, ``failed``, ``membership``, ``signal``,
        ``hung`` (with --hang-timeout; the report is in ``self._hangs.report``), ``closed`` (another
        node ended the job) or ``store`` (the rendezvous store is gone)."""
        # Exits are seen at once; this interval only paces questions to the rendezvous store.
        # At least a second apart: each check is a few store reads, and with thousands of nodes
        # asking ten times a second the store would serve little else.
        interval = max(self.config.monitor_interval, MIN_MEMBERSHIP_INTERVAL)
        next_check = time.monotonic() + interval
        while True:
            if self._signal is not None:
                return "signal", []
            pause = min(interval, next_check - time.monotonic())
            if self._hangs is not None:
                pause = min(pause, self._hangs.next_due())
            ended = group.wait(max(0.0, pause))
            failed = [s for s in ended if s.process is not None and s.process.returncode != 0]
            if failed:
                # Collect every worker that already failed, so the root cause is the earliest.
                failed += [
                    s for s in group.slots
                    if s not in failed and s.process is not None and s.process.poll() not in (None, 0)
                ]
                return "failed", failed
            if group.all_done():
                return "succeeded", []
            if self._hangs is not None and self._hangs.poll() is not None:
                return "hung", self._hangs.hung_slots()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + interval
                change = self._membership_changed(handler)
                if change in ("closed", "store"):
                    return str(change), []
                if change:
                    return "membership", []

    def _await_lost_nodes(self, handler: RendezvousHandler) -> bool:
        """After a failure with no restart left: was a lost node the cause?

        A node that dies breaks its peers' collectives at once, but its heartbeats take up to
        the heartbeat timeout to be missed; wait that long (at most) for the verdict.
        """
        grace = _heartbeat_timeout(handler, self.config)
        deadline = time.monotonic() + grace
        while True:
            try:
                lost = handler.lost_nodes()
            except (StoreError, RendezvousError, OSError):
                return False
            if lost:
                log.warning("lost contact with node(s) %s; re-forming the group", ", ".join(lost))
                self._emit("membership_changed", lost=list(lost), waiting=0)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def _membership_changed(self, handler: RendezvousHandler) -> bool | str:
        try:
            if handler.is_closed():
                return "closed"
            waiting = handler.num_nodes_waiting()
            lost = handler.lost_nodes()
        except (StoreError, RendezvousError, OSError) as exc:
            note = self._store_gone(handler, exc)
            if note is not None:
                self._store_note = note
                return "store"
            log.warning("cannot reach the rendezvous store: %s", exc)
            return False
        if lost:
            log.warning("lost contact with node(s) %s; re-forming the group", ", ".join(lost))
            self._emit("membership_changed", lost=list(lost), waiting=waiting)
            return True
        if waiting > 0:
            log.info("%d node(s) waiting to join; re-forming the group", waiting)
            self._emit("membership_changed", lost=[], waiting=waiting)
            return True
        return False

    def _failures(self, group: WorkerGroup, failed: list[WorkerSlot]) -> list[Any]:
        from launcher.failures.report import WorkerFailure

        failures = []
        for slot in failed:
            process = slot.process
            assert process is not None
            code = process.returncode
            failures.append(
                WorkerFailure(
                    node=self.node,
                    rank=slot.global_rank,
                    local_rank=slot.local_rank,
                    role=self.config.role,
                    pid=process.pid,
                    exitcode=code if code is not None and code >= 0 else None,
                    signal=-code if code is not None and code < 0 else None,
                    timestamp=process.ended_at or time.time(),
                    error_file=slot.error_file,
                    stderr_tail=group.stderr_tail(slot),
                    group_rank=self._group_rank,
                    node_addr=self._node_addr,
                )
            )
            self._emit(
                "worker_failed",
                rank=slot.global_rank,
                local_rank=slot.local_rank,
                pid=process.pid,
                exitcode=failures[-1].exitcode,
                signal=failures[-1].signal,
            )
        failures.sort(key=lambda f: f.timestamp)
        return failures

    # -- how a failed job ends on every node (see launcher.agent.outcome) ----------------------

    def _rank_states(self, group: WorkerGroup, killed: set[int]) -> list[Any]:
        from launcher.failures.report import RankState

        states = []
        for slot in group.slots:
            process = slot.process
            code = process.returncode if process is not None else None
            if process is None or code is None:
                state = "running"
            elif slot.local_rank in killed:
                state = "killed by the agent"
            else:
                state = "succeeded" if code == 0 else "failed"
            states.append(RankState(slot.global_rank, slot.local_rank, process.pid if process else None, state, code))
        return states

    def _outcome(self, info: RendezvousInfo, root: Any = None, reason: str | None = None) -> Any:
        from launcher.agent.outcome import NodeOutcome

        return NodeOutcome(info.group_rank, self.node, self._node_addr, root, reason)

    def _store_gone(self, handler: RendezvousHandler, exc: BaseException) -> str | None:
        """One line when the rendezvous store is gone or cut off (a fresh connect fails), else None."""
        probe = getattr(handler, "store_problem", None)
        problem = probe() if probe is not None else None
        if problem is None:
            return None
        where = getattr(handler, "store_location", None)
        return f"{where() if where is not None else 'the rendezvous store'} is gone: {problem}"

    def _publish(self, info: RendezvousInfo, handler: RendezvousHandler, outcome: Any) -> None:
        from launcher.agent.outcome import outcome_prefix, publish_outcome

        if info.store is None or info.group_world_size == 1 or self._store_note is not None:
            return
        try:
            publish_outcome(info.store, outcome_prefix(self.config.run_id, info.round), outcome)
        except (StoreError, RendezvousError, OSError) as exc:
            self._store_note = self._store_gone(handler, exc) or f"cannot reach the rendezvous store: {exc}"

    def _gather(self, info: RendezvousInfo, handler: RendezvousHandler, *, closer: bool) -> dict[int, Any]:
        """The other nodes' records: all of them (a closer, whose cause may not be the first), or
        until one names a cause (a node that only saw the job end)."""
        from launcher.agent.outcome import OUTCOME_TIMEOUT, collect_outcomes, outcome_prefix

        if info.store is None or info.group_world_size == 1 or self._store_note is not None:
            return {}

        def lost() -> set[int]:
            with contextlib.suppress(StoreError, RendezvousError, OSError):
                names = set(handler.lost_nodes())
                return {g for g, node in enumerate(info.participants) if node in names}
            return set()

        def enough(found: dict[int, Any]) -> bool:
            if closer:
                return len(found) >= info.group_world_size
            return any(o.root or o.reason for g, o in found.items() if g != info.group_rank)

        # Nodes of a fixed-membership rendezvous (static) never learn that the job was closed,
        # so they write no record to wait for: read what is there.
        timeout = 0.0 if isinstance(handler, FixedMembership) else OUTCOME_TIMEOUT
        try:
            return collect_outcomes(info.store, outcome_prefix(self.config.run_id, info.round),
                                    info.group_world_size, until=enough, lost=lost, timeout=timeout)
        except (StoreError, RendezvousError, OSError) as exc:
            self._store_note = self._store_gone(handler, exc) or f"cannot reach the rendezvous store: {exc}"
            return {}

    def _job_failed(self, info: RendezvousInfo, handler: RendezvousHandler, failures: list[Any],
                    ranks: list[Any], logs_specs: Any, *, closer: bool, hang: Any = None) -> AgentResult:
        """End a failed job on this node: share this node's outcome, close the rendezvous, learn
        the other nodes' outcomes, and report the job's root cause and every local rank."""
        from launcher.failures.report import FailureReport, ReportedFailure

        local = FailureReport.from_failures(failures, oom_watch=self._oom_watch) if failures else None
        if closer or local is not None:
            self._publish(info, handler, self._outcome(info, root=local.root_cause.to_dict() if local else None))
        if closer:
            with contextlib.suppress(StoreError, RendezvousError, OSError):
                handler.set_closed()
        others = self._gather(info, handler, closer=closer or local is not None)
        remote = [o for g, o in others.items() if g != info.group_rank]
        roots = [ReportedFailure.from_dict(o.root) for o in remote if o.root]
        entries = ([local.root_cause, *local.others] if local else []) + roots
        multi = info.group_world_size > 1
        this_node = f"{self.node} (node {info.group_rank}{', ' + self._node_addr if self._node_addr else ''})"
        notes = [self._store_note] if self._store_note else []
        if entries:
            entries.sort(key=lambda r: (r.time, r.failure.timestamp, r.failure.rank))
            root = entries[0]
            others_local = [e for e in entries[1:] if e in (local.failures if local else [])]
            if local is not None and root is local.root_cause:
                count = len(local.failures)
                title = f"{count} worker{'s' if count != 1 else ''} failed"
            else:
                title = f"the job failed on {root.failure.node_label}"
            report = FailureReport([root, *others_local], title=title, created=time.time(),
                                   node_ranks=ranks if multi else [], this_node=this_node if multi else "",
                                   notes=notes)
            if hang is not None:
                report.title = "a rank hung; the workers were stopped"
                report.hang = hang.to_dict()
            self._write_report(report, logs_specs)
            return AgentResult(exit_code=1, failures=failures, report=report)
        reasons = [f"{o.label}: {o.reason}" for o in remote if o.reason]
        if self._store_note:
            message = self._store_note
        elif reasons:
            message = "the job was ended by " + "; ".join(reasons)
        else:
            message = "the job was ended by another node (its workers failed, or it was stopped)"
        if multi and ranks:
            self._log_ranks(ranks)
        return AgentResult(exit_code=1, message=message)

    def _log_ranks(self, ranks: list[Any]) -> None:
        """This node's ranks and their states, ahead of the one-line error that ends the job."""
        from launcher.failures.report import render_ranks

        where = f"{self.node} (node {self._group_rank}{', ' + self._node_addr if self._node_addr else ''})"
        log.warning("%s", "\n".join(render_ranks(ranks, f"Ranks on this node ({where}):")))

    def _write_report(self, report: Any, logs_specs: Any) -> None:
        with contextlib.suppress(Exception):
            # Ours names it run_log_dir; torch's DefaultLogsSpecs keeps it in _run_log_dir.
            log_dir = getattr(logs_specs, "run_log_dir", None) or getattr(logs_specs, "_run_log_dir", None)
            if log_dir:
                report.write_json(os.path.join(log_dir, "failure_report.json"))

    def _return_values(self, group: WorkerGroup) -> dict[int, Any]:
        values: dict[int, Any] = {}
        if self.entry.function is None:
            return values
        for slot in group.slots:
            process = slot.process
            result = getattr(process, "result", None)
            if result is not None:
                values[slot.global_rank] = result()
        return values

    def _await_done(self, store: Any, done: str, timeout: float, info: RendezvousInfo,
                    handler: RendezvousHandler) -> bool:
        """Wait for every node to finish; False when another node ended the job meanwhile
        (closed without every node done): then say why, and leave the barrier at once."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                store.wait([done], timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                return True
            except StoreTimeoutError:
                if time.monotonic() >= deadline:
                    raise
            if handler.is_closed() and not store.check([done]):
                # This node's record tells a failing node it need not wait for us.
                self._publish(info, handler, self._outcome(info))
                others = self._gather(info, handler, closer=False)
                causes = [
                    f"{o.label}: " + (f"rank {o.root.get('rank')} {o.root.get('exit')}" if o.root else str(o.reason))
                    for g, o in sorted(others.items()) if g != info.group_rank and (o.root or o.reason)
                ]
                log.warning("every worker of this node succeeded, but the job ended on another node%s",
                            f" ({'; '.join(causes)})" if causes else "")
                return False

    def _exit_barrier(self, info: RendezvousInfo, handler: RendezvousHandler) -> None:
        """Wait for every node to finish, then close the rendezvous, without a node leaving early.

        Two phases: every node waits until all have finished (``done``), closes the rendezvous,
        and says it is leaving (``left``); a node then waits, briefly, until every node has left
        the store alone, so the node that serves the store never shuts it down under a peer
        that is still using it.
        """
        if info.group_world_size == 1 or info.store is None:
            with contextlib.suppress(StoreError, RendezvousError, OSError):
                handler.set_closed()
            return
        store = info.store
        key = f"launcher/{self.config.run_id}/exit/{info.round}"
        timeout = self.config.exit_barrier_timeout
        try:
            if store.add(f"{key}/count", 1) == info.group_world_size:
                store.set(f"{key}/done", b"1")
            if not self._await_done(store, f"{key}/done", timeout, info, handler):
                return
            handler.set_closed()
            if store.add(f"{key}/left", 1) == info.group_world_size:
                store.set(f"{key}/all_left", b"1")
        except (StoreError, RendezvousError, OSError) as exc:
            # Every worker here succeeded; a peer or the store going away now does not undo that.
            log.warning("exit barrier: not every node finished within %.0fs (%s); exiting anyway", timeout, exc)
            return
        try:
            store.wait([f"{key}/all_left"], timeout=min(timeout, 30.0))
        except (StoreError, RendezvousError, OSError) as exc:
            # Expected on every node but the store's host: the host may shut the store down the
            # moment the last node has said it is leaving.
            log.debug("exit barrier: store gone after every node left (%s)", exc)


def _lost_since(previous: RendezvousInfo, current: RendezvousInfo) -> set[str]:
    """Participants of ``previous`` that are not in ``current`` (empty when either is unknown)."""
    if not previous.participants or not current.participants:
        return set()
    return set(previous.participants) - set(current.participants)


def _heartbeat_timeout(handler: RendezvousHandler, config: LaunchConfig) -> float:
    """How long a lost node may go unnoticed by ``handler`` (bounded to a minute)."""
    value = getattr(handler, "heartbeat_timeout", None)
    if value is None:
        value = config.rdzv_configs.get("heartbeat_timeout", 0)
    try:
        return min(60.0, max(0.0, float(value)))
    except (TypeError, ValueError):
        return 0.0


def _hang_outcome(remaining_restarts: int, max_restarts: int) -> str:
    if remaining_restarts > 0:
        number = max_restarts - remaining_restarts + 1
        return f"stopping the workers and restarting them (restart {number} of {max_restarts})"
    return "stopping the workers; no restarts left, the job fails"


def _signal_message(signum: int) -> str:
    from launcher.failures.report import explain_signal

    message = f"received {signal.Signals(signum).name}; workers were stopped"
    why = explain_signal(signum)
    return f"{message} ({why})" if why else message


def _describe_exit(failure: Any) -> str:
    if failure.signal:
        try:
            return f"was killed by {signal.Signals(failure.signal).name}"
        except ValueError:
            return f"was killed by signal {failure.signal}"
    return f"exited with code {failure.exitcode}"


def _cpu_list(cpus: frozenset[int] | None) -> str:
    if not cpus:
        return ""
    ordered = sorted(cpus)
    parts = []
    start = prev = ordered[0]
    for cpu in ordered[1:] + [-2]:
        if cpu != prev + 1:
            parts.append(f"{start}-{prev}" if start != prev else str(start))
            start = cpu
        prev = cpu
    return ",".join(parts)


__all__ = ["Agent", "AgentResult", "Entrypoint", "LaunchError", "SignalReceived", "worker_environment"]
