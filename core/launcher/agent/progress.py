"""``--max-no-progress-restarts``: stop restarting a job whose restarts get no further.

Progress is the highest training step the job reached, as its ranks give it to
``launcher.heartbeat(step)``. Each worker keeps its highest step in a record of its own
(:mod:`launcher.hangs.progress`); the agent reads this node's records only when a round forms
after the first (:func:`ProgressTracker.local_step`, the one step source: another can be added
there).

The verdict is taken when a round forms, before its workers start, from inputs every node of the
round shares: each node adds to the record it already publishes for the rank exchange
(:func:`launcher.agent.ranks.assign_ranks`) its own furthest step, whether a failure used one of
its restarts since the last round, and the state it holds (the furthest step the job reached,
the restarts in a row that did not pass it); the node of group rank 0, which reads every record
anyway, combines them (:func:`combine`) into one new state and writes it back with each node's
ranks. No store request is added, and every node, a spare that has just joined included, adopts
the same state, so all reach the same verdict in the same round. A single node combines its own
record alone.

What counts: a round that follows a failure (a worker failed or hung, with a full restart or an
in-place recovery) whose restart was not taken back because a node left. A round formed for a
membership change (a node joined or left, or the failure was a lost node's doing) counts
nothing; a preemption or a stop by signal ends the agent, and a requeued job starts afresh. Any
round in which the job passed its furthest step starts the count again. Without a step from any
rank there is nothing to judge, and the count never starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from launcher.agent.result import AgentResult
from launcher.errors import LaunchError
from launcher.flags import FlagValues
from launcher.values import parse_int

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.agent import Agent
    from launcher.agent.restart import RestartTally

__all__ = ["DEFAULT_LIMIT", "EXIT_NO_PROGRESS", "NoProgress", "ProgressTracker", "combine", "end_job", "tracker_for",
           "read_progress"]

log = logging.getLogger("launcher.agent")

#: The exit status of a job stopped because its restarts made no progress: a scheduler must not
#: requeue it (the same failure would come back). NVIDIA's ft_launcher (nvidia-resiliency-ext)
#: exits 93 when it stops for no progress; so does launcher, so that tooling keyed on it works
#: with either. Outside sysexits' 64-78 (69 is a sick node here) and the shell's 126-165.
EXIT_NO_PROGRESS = 93
#: ``--max-no-progress-restarts`` when not given.
DEFAULT_LIMIT = 3
#: The highest value accepted (far above any useful one; ``--max-restarts`` caps restarts anyway).
MAX_LIMIT = 1_000_000


def read_progress(values: FlagValues) -> int:
    """``--max-no-progress-restarts`` (or ``PET_MAX_NO_PROGRESS_RESTARTS``), checked: 0 turns the tracker off."""
    value = values["max_no_progress_restarts"]
    if value is None or (isinstance(value, str) and not value.strip()):
        return DEFAULT_LIMIT
    return parse_int(value.strip() if isinstance(value, str) else value, values.source("max_no_progress_restarts"),
                     0, MAX_LIMIT)


class NoProgress(LaunchError):
    """The job's last restarts made no progress: this node does not start its workers again."""

    exit_code = EXIT_NO_PROGRESS

    def __init__(self, step: int, restarts: int) -> None:
        super().__init__(
            f"no progress in {restarts} restart{'s' if restarts != 1 else ''} in a row: each ended before passing "
            f"step {step} (the furthest the job reached); not restarting (exit {EXIT_NO_PROGRESS}: do not requeue)")
        self.step = step
        self.restarts = restarts


def combine(records: Sequence[Any]) -> list[Any] | None:
    """The job's new state ``[furthest step, restarts in a row without passing it]`` from every
    node's record ``[its furthest step, a failure used a restart, its state's step, its count]``
    (``None`` items: nodes that keep no record). Deterministic, so every node of a round gets the
    same answer, whichever node computes it."""
    found = [r for r in records if isinstance(r, list) and len(r) >= 4]
    if not found:
        return None
    steps = [r[0] for r in found if isinstance(r[0], int)]
    failed = any(bool(r[1]) for r in found)
    # Every node that took part in the last round holds the same state (it adopted the last
    # answer); a node that has just joined holds none.
    held = [(r[3], r[2]) for r in found if isinstance(r[2], int) and isinstance(r[3], int)]
    count, best = max(held) if held else (0, None)
    reached = max(steps) if steps else None
    if reached is not None and (best is None or reached > best):
        return [reached, 0]  # progress (or the first step seen): the count starts again
    if failed and best is not None:
        count += 1  # a restart that ended before passing the furthest step
    return [best, count]


class ProgressTracker:
    """This node's side of ``--max-no-progress-restarts`` (see the module docstring)."""

    def __init__(self, limit: int, token: str) -> None:
        self.limit = limit
        #: Where this node's workers keep their steps (``None``: none could be made, nothing to judge).
        self.dir = _make_dir(token)
        #: The job's state as last agreed: its furthest step, and the failed restarts in a row since.
        self.best: int | None = None
        self.count = 0
        #: This node's furthest step seen so far (a worker's record may be replaced: see local_step).
        self._local: int | None = None
        #: Restarts charged (RestartTally) when the last round formed.
        self._charged = 0
        #: Set when the job stops (:class:`NoProgress`).
        self.verdict: NoProgress | None = None

    def local_step(self) -> int | None:
        """The highest step any rank of this node has reached since the agent started (``None``:
        none gave one). The one step source: each worker's record in :attr:`dir`."""
        from launcher.hangs.progress import RECORD

        if self.dir is None:
            return self._local
        with contextlib.suppress(OSError):
            for name in os.listdir(self.dir):
                with contextlib.suppress(OSError, ValueError):
                    fd = os.open(os.path.join(self.dir, name), os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        data = os.read(fd, RECORD.size)
                    finally:
                        os.close(fd)
                    if len(data) == RECORD.size:
                        step, written = RECORD.unpack(data)
                        if written == 1 and (self._local is None or step > self._local):
                            self._local = step
        return self._local

    def record(self, tally: RestartTally) -> list[Any]:
        """This node's record for the round forming now (see :func:`combine`)."""
        charged = tally.in_place + tally.full
        failed = charged > self._charged  # a refund (a node left) has already been taken back
        self._charged = charged
        return [self.local_step(), failed, self.best, self.count]

    @staticmethod
    def combiner() -> Any:
        """How rank 0 turns every node's record into the round's state (:func:`combine`)."""
        return combine

    def adopt(self, state: Any) -> None:
        """Take the round's agreed state; raise :class:`NoProgress` when the job must stop."""
        if not (isinstance(state, list) and len(state) == 2):
            return  # a node of group rank 0 that keeps no record: nothing agreed, nothing judged
        best, count = state
        if best != self.best or count != self.count:
            log.debug("progress: furthest step %s, %d restart(s) in a row without passing it", best, count)
        self.best, self.count = best, count
        if best is not None and self.limit > 0 and count >= self.limit:
            self.verdict = NoProgress(best, count)
            raise self.verdict

    def close(self) -> None:
        """Remove the step directory."""
        folder, self.dir = self.dir, None
        if folder is None:
            return
        with contextlib.suppress(OSError):
            for name in os.listdir(folder):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))
            os.rmdir(folder)


def _make_dir(token: str) -> str | None:
    from launcher.hangs.progress import step_dirs

    for folder in step_dirs(token):
        try:
            os.mkdir(folder, 0o700)
        except OSError:
            continue
        return folder
    log.debug("progress: no step directory could be made; --max-no-progress-restarts has nothing to judge")
    return None


def end_job(agent: Agent, exc: NoProgress) -> AgentResult:
    """End the job on this node for ``exc``: stop the workers an in-place recovery kept, say why."""
    import signal

    kept = agent._kept
    if kept is not None:
        agent._kept = None
        if agent._recovery is not None:
            agent._recovery.dismiss(kept)
        kept.stop(signal.SIGTERM, agent.plan.shutdown_timeout)
        kept.close()
        agent._group = None
    agent._emit("job_failed", reason="no progress", step=exc.step, no_progress_restarts=exc.restarts)
    return AgentResult(exit_code=EXIT_NO_PROGRESS, message=str(exc))


def tracker_for(plan: Any, token: str) -> ProgressTracker | None:
    """The tracker for ``plan`` (``None`` with ``--max-no-progress-restarts 0``, or without restarts:
    there is nothing to stop). ``token``: the job's (the workers find the step directory by it)."""
    limit = plan.settings.get("progress")
    limit = DEFAULT_LIMIT if limit is None else int(limit)
    if limit <= 0 or plan.max_restarts <= 0:
        return None
    return ProgressTracker(limit, token)
