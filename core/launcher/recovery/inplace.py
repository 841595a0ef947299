"""The agent's side of recovery in place: leave, re-form, resume.

After a failure (or when the group must re-form) the agent asks :meth:`InPlaceRecovery.leave`
first. When every local worker runs under :func:`launcher.recoverable` (each registered on the
channel), every live worker is told to leave its function; once each has said so (within
``--recovery-timeout``), the group is kept: the agent joins the next round through the same
rendezvous as a restart, then :meth:`InPlaceRecovery.resume` gives each live worker the new
round's environment and starts a fresh process only in the slots whose process died.

When any of that cannot be done, :meth:`leave` says why in one line and tells every worker
waiting in the channel to exit (a worker that raised raises again, exits 1 and is reported as
today); the agent then does its full restart.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.recovery.channel import ControlServer

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.group import WorkerGroup, WorkerSlot
    from launcher.hangs.report import HangReport
    from launcher.recovery.settings import RecoverySettings

log = logging.getLogger("launcher.recovery")

__all__ = ["InPlaceRecovery"]

#: Seconds a failed exit gets to show up after a raise is reported (see :meth:`InPlaceRecovery.failed`).
DEATH_GRACE = 0.02
#: Seconds a worker told to exit (no recovery) has to raise its exception again and end.
DISMISS_TIMEOUT = 5.0
#: Seconds a registered worker whose channel connection closed gets to be reaped: a dying
#: process's sockets close before its last thread has exited (a loaded machine stretches that).
EXIT_REAP_GRACE = 5.0


class InPlaceRecovery:
    """One agent's in-place recovery: the control channel and the steps of a recovery."""

    def __init__(self, settings: RecoverySettings, token: str, emit: Callable[..., None],
                 interrupted: Callable[[], bool] = lambda: False) -> None:
        """``token``: the job's (the workers find the channel by it). ``interrupted`` says whether
        the agent received a signal: waiting for the workers to leave then ends at once (the agent
        stops them all)."""
        self.settings = settings
        self._emit = emit
        self._interrupted = interrupted
        self.server = ControlServer(token)
        #: The reason for the last recovery, for the log line and the event.
        self.reason = ""
        #: Why the last failure could not be recovered in place, when the workers used the wrapper.
        self.fallback: str | None = None

    def close(self) -> None:
        self.server.close()

    # -- while the workers run -----------------------------------------------------------------

    def attach(self, group: WorkerGroup, wait: Callable[[int], None]) -> None:
        """Say which pid each slot's worker is (registrations are answered from then on), and
        let the group's wait wake up when a worker reports that its function raised (``wait``
        registers the descriptor with the group)."""
        self.server.expect({slot.local_rank: slot.process.pid for slot in group.slots if slot.process is not None})
        wait(self.server.wakeup_fd)

    def raised(self, group: WorkerGroup) -> list[WorkerSlot]:
        """The slots whose worker reported that its function raised, earliest first."""
        self.server.drain_wakeup()
        found = []
        for slot in group.slots:
            link = self.server.link(slot.local_rank)
            if link is not None and link.state == "raised":
                found.append((link.raised_at, slot))
        return [slot for _, slot in sorted(found, key=lambda item: item[0])]

    def failed(self, group: WorkerGroup, exited: list[WorkerSlot]) -> list[WorkerSlot]:
        """The failed slots, root cause first: ``exited`` (failed exits just seen), the other
        failed exits, then the workers that reported a raise, earliest first.

        A worker's death breaks its peers' collectives, so their raise follows it: when only raises
        are seen, an exit gets :data:`DEATH_GRACE` seconds to show up, and comes first."""
        raised = self.raised(group)
        if raised and not exited:
            group.wait(DEATH_GRACE)  # returns at once on an exit
        dead = [s for s in group.slots
                if s not in exited and s.process is not None and s.process.poll() not in (None, 0)]
        return [*exited, *dead, *(s for s in raised if s not in exited and s not in dead)]

    # -- after a failure -------------------------------------------------------------------------

    def blocker(self, group: WorkerGroup, restarts_left: int, unsupported: str | None = None) -> str | None:
        """Why this failure cannot be recovered in place (``None``: it can)."""
        if not self.settings.in_place or restarts_left <= 0:
            return "no restart left" if restarts_left <= 0 else "--recovery restart"
        self._await_dying(group)
        missing = [slot for slot in group.slots
                   if slot.process is not None and slot.process.poll() is None
                   and self.server.link(slot.local_rank) is None]
        if missing:
            named = ", ".join(f"local rank {s.local_rank} (pid {s.process.pid})" for s in missing if s.process)
            return f"{named} did not register with launcher.recoverable"
        if not any(self.server.link(slot.local_rank) is not None for slot in group.slots):
            return "no worker runs under launcher.recoverable"
        if unsupported is not None:
            return f"in-place recovery does not support {unsupported} yet"
        return None

    def _await_dying(self, group: WorkerGroup) -> None:
        """Wait (bounded) until the workers whose channel connection closed on their side are
        reaped: such a worker is dying, not one that never registered."""
        deadline = time.monotonic() + EXIT_REAP_GRACE
        while time.monotonic() < deadline:
            dying = [s for s in group.slots if s.process is not None and s.process.poll() is None
                     and self.server.link(s.local_rank) is None
                     and self.server.hung_up(s.local_rank, s.process.pid)]
            if not dying:
                return
            group.wait(0.01)

    def can_recover(self, group: WorkerGroup, restarts_left: int) -> bool:
        """Whether a recovery in place can be tried now (it may still fall back, see :meth:`leave`)."""
        return self.blocker(group, restarts_left) is None

    def describe(self, group: WorkerGroup, failed: list[WorkerSlot]) -> str:
        """One phrase naming the root cause: a worker that died (its death broke its peers'
        collectives: their raise reports can reach the agent before its exit does, on a loaded
        machine), else the earliest failed slot. Called once every worker has left, when a death
        has certainly been seen."""
        dead = sorted((s for s in group.slots if s.process is not None and s.process.poll() not in (None, 0)),
                      key=lambda s: getattr(s.process, "ended_at", None) or 0.0)
        if dead:
            failed = [*dead, *failed]
        if not failed:
            return "the group must re-form"
        first = failed[0]
        assert first.process is not None
        link = self.server.link(first.local_rank)
        if first.process.poll() is None and link is not None and link.error:
            return f"local rank {first.local_rank} (pid {first.process.pid}) raised {link.error}"
        from launcher.failures.exits import describe_exit

        code = first.process.returncode
        ended = describe_exit(code if code is not None and code >= 0 else None,
                              -code if code is not None and code < 0 else None)
        return f"local rank {first.local_rank} (pid {first.process.pid}) {ended}"

    def leave(self, group: WorkerGroup, failed: list[WorkerSlot], *, restarts_left: int,
              unsupported: str | None = None) -> bool:
        """Make every live worker leave its function; whether the group is kept for a recovery
        in place. When not, one line says why (if the workers used the wrapper at all) and every
        worker waiting in the channel is told to exit."""
        self.fallback = None
        group.kill_stopped_hung()  # a stopped rank judged hung cannot leave: it dies, its slot restarts
        why = self.blocker(group, restarts_left, unsupported)
        if why is None:
            live = [s for s in group.slots if s.process is not None and s.process.poll() is None]
            for slot in live:
                self.server.send(slot.local_rank, {"op": "recover"})
            stuck = self._await_left(group, live)
            if not stuck:
                self.reason = self.describe(group, failed)
                return True
            why = ", ".join(f"local rank {s.local_rank} (pid {s.process.pid})" for s in stuck if s.process)
            why += f" did not leave its function within {self.settings.timeout:g}s (--recovery-timeout)"
            if self._interrupted():
                why = "the agent received a signal"
        if any(self.server.link(s.local_rank) is not None for s in group.slots) and restarts_left > 0:
            log.warning("in-place recovery not possible: %s; restarting every worker", why)
            self.fallback = why
        self.dismiss(group)
        return False

    def _await_left(self, group: WorkerGroup, live: list[WorkerSlot]) -> list[WorkerSlot]:
        """Wait until every worker of ``live`` has left its function or died; those that did neither."""
        deadline = time.monotonic() + self.settings.timeout
        while True:
            stuck = []
            for slot in live:
                link = self.server.link(slot.local_rank)
                assert slot.process is not None
                if slot.process.poll() is None and (link is None or link.state != "left"):
                    stuck.append(slot)
            if not stuck or time.monotonic() >= deadline or self._interrupted():
                return stuck
            group.wait(0.0)  # notes exits (their descriptors leave the selector)
            self.server.wait(min(0.05, max(0.0, deadline - time.monotonic())))

    def dismiss(self, group: WorkerGroup) -> None:
        """Tell every worker waiting in the channel to exit; wait (bounded) for those that raised,
        so their exit status and error file are what the failure report shows."""
        raised = []
        for slot in group.slots:
            link = self.server.link(slot.local_rank)
            if link is not None and link.state in ("raised", "left"):
                self.server.send(slot.local_rank, {"op": "exit"})
                raised.append(slot)
        deadline = time.monotonic() + DISMISS_TIMEOUT
        while any(s.process is not None and s.process.poll() is None for s in raised) \
                and time.monotonic() < deadline:
            group.wait(0.05)

    # -- the new round ---------------------------------------------------------------------------

    def resume(self, group: WorkerGroup, envs: dict[int, dict[str, str]]) -> list[WorkerSlot]:
        """Give each live worker its new environment (the variables that changed); the slots
        whose process died, for the caller to start again. ``envs`` are the new round's
        environments by local rank."""
        dead = []
        for slot in group.slots:
            env = dict(slot.env)
            env.update(envs[slot.local_rank])
            changed = {key: value for key, value in env.items() if slot.env.get(key) != value}
            slot.env = env
            alive = slot.process is not None and slot.process.poll() is None
            if alive and self.server.send(slot.local_rank, {"op": "resume", "env": changed}):
                self.server.set_state(slot.local_rank, "running")
                continue
            if alive and slot.process is not None:  # alive but unreachable: start afresh
                slot.process.signal_group(signal.SIGKILL)
                deadline = time.monotonic() + 5.0
                while slot.process.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
            self.server.forget(slot.local_rank)
            dead.append(slot)
        if dead:
            self.server.hold()  # until attach() names the fresh processes
        return dead

    def record(self, group: WorkerGroup, count: int, left: int, total: int, hang: HangReport | None = None) -> None:
        """Say that the group recovers in place: one log line and a ``group_restarted`` event."""
        if hang is not None:
            self.reason = f"{hang.reason} (detected by {hang.detected_by})"
        log.warning("worker group %s: %s; recovering in place (%d of %d restarts left)",
                    "hung" if hang is not None else "failed", self.reason, left, total)
        replaced = [s.local_rank for s in group.slots if s.process is not None and s.process.poll() is not None]
        self._emit("group_restarted", count=count, reason=self.reason, cause="hang" if hang is not None else "failure",
                   mode="in-place recovery",
                   replaced=replaced, kept=[s.local_rank for s in group.slots if s.local_rank not in replaced])
