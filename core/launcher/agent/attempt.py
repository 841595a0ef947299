"""Starting an attempt: ranks, each worker's environment, then a new group, or the kept one.

A part of :class:`~launcher.agent.agent.Agent` moved out of its module for size: it reads and
sets the agent's private state, as the agent's own methods would. After a restart every worker is started afresh. After
an in-place recovery (:mod:`launcher.recovery.inplace`) the agent's kept group goes on: its live
workers get the new round's environment through the control channel, and only the slots whose
process died get a fresh one.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from launcher.agent.environment import worker_environment
from launcher.agent.group import WorkerGroup, WorkerSlot
from launcher.agent.ranks import assign_ranks
from launcher.agent.reporting import started_workers
from launcher.private_dirs import make_private_dir

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.agent import Agent
    from launcher.containment.watchdog import Watchdog
    from launcher.logs.pump import OutputPump
    from launcher.rendezvous.api import RendezvousInfo

__all__ = ["start_attempt"]


def _slots(agent: Agent, info: RendezvousInfo) -> tuple[list[WorkerSlot], dict[int, dict[str, str]]]:
    """This round's slots and their environments (torchrun's variables on the plan's base)."""
    plan = agent.plan
    progress = agent._progress  # --max-no-progress-restarts: agreed with the ranks (launcher.agent.progress)
    with agent._signals.interruptible():  # waits for every node's share of the ranks
        ranks = assign_ranks(
            info.store,
            f"launcher/{plan.run_id}/ranks/{info.round}",
            info.group_rank,
            info.group_world_size,
            plan.role,
            plan.nproc_per_node,
            timeout=max(60.0, plan.exit_barrier_timeout),
            share=progress.record(agent._tally) if progress is not None else None,
            combine=progress.combiner() if progress is not None else None,
        )
    if progress is not None:
        progress.adopt(ranks.shared)  # raises NoProgress: no worker starts
    slots = []
    envs: dict[int, dict[str, str]] = {}
    for local_rank in range(plan.nproc_per_node):
        global_rank, role_rank = ranks.base_rank + local_rank, ranks.base_role_rank + local_rank
        env = worker_environment(plan, info, (local_rank, global_rank, role_rank),
                                 (ranks.world_size, ranks.role_world_size), agent._restart_count)
        envs[local_rank] = env
        slots.append(WorkerSlot(local_rank, global_rank, role_rank, env))
    return slots, envs


def start_attempt(agent: Agent, info: RendezvousInfo, pump: OutputPump, watchdog: Watchdog) -> WorkerGroup:
    """Start this round's workers (or resume the kept ones); the group, also in ``agent._group``."""
    plan, workers = agent.plan, agent.plan.workers
    slots, envs = _slots(agent, info)
    if agent._kept is not None:
        return _resume(agent, agent._kept, slots, envs, info)
    dest = plan.logs_specs.reify(envs)
    if agent._hangs is not None:
        agent._hangs.prepare(envs, slots)
    if agent._preemption is not None:  # the notice file, and where other nodes' notices come
        agent._preemption.prepare(envs, info)
    for slot in slots:  # reify may have added TORCHELASTIC_ERROR_FILE
        slot.env = envs[slot.local_rank]
    if plan.entry.function is not None and agent._result_dir is None:
        agent._result_dir = make_private_dir("launcher_results_")
    group = WorkerGroup(slots, pump, watchdog, wakeup_fd=agent._signals.wakeup_fd)
    agent._group = group
    agent._stragglers.attach(envs, group, info)  # --straggler-detection: timing slots into envs (slots share them)
    try:
        group.start(
            plan.entry,
            dest,
            role=plan.role,
            prefix_template=workers.prefix_template,
            stdout_filters=workers.stdout_filters,
            stderr_filters=workers.stderr_filters,
            cpus=workers.cpus,
            start_method=workers.start_method,
            result_dir=agent._result_dir or "",
            worker_tty=workers.worker_tty,
            preload=agent._preload,
        )
    except OSError as exc:
        # EMFILE from pipe(), EAGAIN from fork(): one line, not a traceback.
        from launcher.limits import ResourceLimitError, describe_spawn_error

        message = describe_spawn_error(exc, plan.nproc_per_node)
        if message is None:
            raise
        # Stop the workers already started here, with time to die, so that run()'s final
        # SIGKILL finds none and the message stays the only line.
        group.stop(signal.SIGKILL, 5.0)
        raise ResourceLimitError(f"node {agent.node}: {message}") from None
    if agent._hangs is not None:
        agent._hangs.attach(group, info)
    if agent._recovery is not None:
        agent._recovery.attach(group, group.add_wakeup)
    # Taken once the workers are on their way, to keep it off the start-up path.
    if agent._oom_watch is None:
        from launcher.failures.oom import OomWatch

        agent._oom_watch = OomWatch()
    agent._oom_watch.snapshot()
    agent._emit("workers_started", restart_count=agent._restart_count, group_rank=info.group_rank,
               workers=started_workers(slots, workers.cpus))
    return group


def _resume(agent: Agent, group: WorkerGroup, slots: list[WorkerSlot], envs: dict[int, dict[str, str]],
            info: RendezvousInfo) -> WorkerGroup:
    """The kept group, in the new round: live workers resume, dead slots start afresh."""
    assert agent._recovery is not None
    agent._kept = None
    if agent._hangs is not None:  # a new heartbeat file: live workers follow it (launcher.recovery.worker)
        agent._hangs.prepare(envs)
    if agent._preemption is not None:
        agent._preemption.prepare(envs, info)
    for kept, fresh in zip(group.slots, slots, strict=True):
        kept.global_rank, kept.role_rank = fresh.global_rank, fresh.role_rank
    agent._stragglers.attach(envs, group, info, kept=True)  # the live workers keep their timing slots
    dead = agent._recovery.resume(group, envs)
    group.respawn(dead)
    if agent._hangs is not None:
        agent._hangs.attach(group, info)
    agent._recovery.attach(group, group.add_wakeup)
    if agent._oom_watch is not None:
        agent._oom_watch.snapshot()
    agent._emit("workers_started", restart_count=agent._restart_count, group_rank=info.group_rank,
               workers=started_workers(group.slots, agent.plan.workers.cpus), in_place=True,
               replaced=[slot.local_rank for slot in dead])
    return group
