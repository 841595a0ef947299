"""Liveness of a round's participants: the heartbeat ring, its scheduler, and lost-node reports.

See "Liveness" in docs/rendezvous.md. Each participant runs a :class:`RingWatcher` for its
round: it beats its own heartbeat counter and watches the next participant's. The watchers of
every handler in a process are stepped by one :class:`HeartbeatScheduler` thread, the
process's :func:`shared_scheduler`. A lost node is published through
:mod:`~launcher.rendezvous.departures` (whose :class:`LostNodes` is re-exported here), and
:func:`await_departures` tells, from the same counters, when the other participants have left.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from launcher.rendezvous.api import RendezvousError
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.departures import HEARTBEAT_TIMEOUT, LostNodes, report_departure
from launcher.rendezvous.keys import RendezvousKeys
from launcher.rendezvous.membership import Membership, list_ids
from launcher.rendezvous.store_ops import StoreOps
from launcher.store.api import StoreError

__all__ = [
    "LEFT",
    "STOPPED_GRACE",
    "HeartbeatScheduler",
    "LostNodes",
    "RingWatcher",
    "await_departures",
    "await_hangups",
    "has_left",
    "shared_scheduler",
]

log = logging.getLogger("launcher.rendezvous")

#: Added to a heartbeat counter by a node that leaves its round on purpose, so that its watcher
#: can tell "left" from "stopped beating" with the read it already does.
LEFT = 1 << 40


def has_left(count: int) -> bool:
    """Whether a heartbeat counter carries the "left" mark."""
    return count >= LEFT


class RingWatcher:
    """This node's heartbeat and its watch on the next participant, for one round.

    Every ``keep_alive_interval`` it adds 1 to this node's heartbeat counter; every tick it
    reads the counter of the next participant in rank order. A counter that has not moved for
    ``liveness_timeout`` seconds of this node's clock (no clock is shared between hosts) makes
    that participant lost: it is published to the round's lost list, and the watcher moves on
    to the participant after it, so that the ring stays closed around the dead node. Its
    scheduler calls :meth:`step` when :attr:`due`.
    """

    def __init__(
        self,
        ops: StoreOps,
        keys: RendezvousKeys,
        membership: Membership,
        config: DynamicRendezvousConfig,
        on_lost: Callable[[str, str], None],
        scheduler: HeartbeatScheduler,
    ) -> None:
        self._ops = ops
        self._keys = keys
        self._round = membership.round
        self._rank = membership.rank
        # Read from the store only once a node is lost (its name): O(1) bytes until then.
        self._ids = membership.ids
        self._config = config
        self._on_lost = on_lost
        self._scheduler = scheduler
        self.run_id = ops.run_id
        self.tick = min(config.keep_alive_interval, config.liveness_timeout / 8, 1.0)
        now = time.monotonic()
        # The first step runs, and beats, at once (not a tick later): the c10d store ties the
        # counter to this node's connection from its first write (launcher.rendezvous.disconnects),
        # so a death is seen from then on; a node killed before it had beaten is found only by
        # the heartbeat timeout, which the exit barrier cannot tell from a paused agent.
        #: When :meth:`step` should run next (``time.monotonic()``).
        self.due = now
        self._next_beat = now
        self._watched = (self._rank + 1) % membership.size
        self._last_value: int | None = None
        self._last_change = now
        self._failing = False
        # Held while a step runs, so that stop() returns only once no step is in flight.
        self._step_lock = threading.Lock()
        self._stopped = False

    def start(self) -> None:
        """Hand this watcher to its scheduler."""
        self._scheduler.add(self)

    def stop(self, wait: bool = True) -> None:
        """No step runs after this returns (the caller then marks the node as left).

        ``wait=False``: no new step starts, but one in flight is not waited for (a store that
        is gone: that step only fails, after its connect timeout, and writes nothing)."""
        self._scheduler.remove(self)
        if not wait:
            self._stopped = True
            return
        with self._step_lock:
            self._stopped = True

    def step(self) -> None:
        """Beat and watch if it is time to, then set the next :attr:`due`."""
        with self._step_lock:
            if not self._stopped:
                self._step()
            self.due = time.monotonic() + self.tick

    def _step(self) -> None:
        cfg, r, rank = self._config, self._round, self._rank
        now = time.monotonic()
        try:
            if now >= self._next_beat:
                self._ops.add(self._keys.heartbeat(r, rank), 1)
                self._next_beat = now + cfg.keep_alive_interval
            if self._watched == rank:
                return  # every other participant is lost or gone: nobody left to watch
            value = self._ops.add(self._keys.heartbeat(r, self._watched), 0)
            if self._failing:
                log.info("rendezvous %r: the store answers again", self.run_id)
                self._failing = False
        except (RendezvousError, StoreError) as exc:
            if not self._failing:
                log.warning("rendezvous %r: heartbeat failed: %s", self.run_id, exc)
                self._failing = True
            return
        now = time.monotonic()
        if has_left(value):
            self._move_on(now)
        elif value != self._last_value:
            self._last_value, self._last_change = value, now
        elif now - self._last_change > cfg.liveness_timeout:
            try:
                lost = self._ids[self._watched]  # the participants list is read now, once
            except (RendezvousError, StoreError) as exc:
                log.warning("rendezvous %r: cannot name lost group rank %d: %s", self.run_id, self._watched, exc)
                return  # tried again at the next step
            log.warning(
                "rendezvous %r: node %s (group rank %d) sent no heartbeat for %.1f s: lost",
                self.run_id,
                lost,
                self._watched,
                now - self._last_change,
            )
            try:
                report_departure(self._ops, self._keys, r, lost, HEARTBEAT_TIMEOUT)
            except (RendezvousError, StoreError) as exc:
                log.warning("rendezvous %r: could not publish the lost node: %s", self.run_id, exc)
            self._on_lost(lost, HEARTBEAT_TIMEOUT)
            self._move_on(now)

    def _move_on(self, now: float) -> None:
        self._watched = (self._watched + 1) % len(self._ids)  # its length needs no read
        self._last_value, self._last_change = None, now


class Stepped(Protocol):
    """What a :class:`HeartbeatScheduler` runs: a :class:`RingWatcher`, or a stand-in in tests."""

    #: When :meth:`step` should run next (``time.monotonic()``); ``step`` moves it on.
    due: float
    #: Named in the message should a step raise.
    run_id: str

    def step(self) -> None: ...


class HeartbeatScheduler:
    """One daemon thread that steps the watchers handed to it, each when it is due.

    A process needs one (:func:`shared_scheduler`): an agent has one handler, and hundreds of
    simulated nodes sharing one interpreter lock would pay more for a thread each than for
    the round itself. The thread starts with the first watcher and outlives rounds, so a
    restart does not wait for a thread to start. In a forked child the scheduler starts
    empty, with no thread, and starts one again when given a watcher.
    """

    def __init__(self, name: str = "launcher-rdzv-heartbeat") -> None:
        self.name = name
        self._reset()
        _schedulers.add(self)

    def _reset(self) -> None:
        # Also the fork handler: the child has no heartbeat thread, must not run its parent's
        # watchers, and may not inherit a lock the parent's thread held at the fork.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._watchers: list[Stepped] = []
        self._thread: threading.Thread | None = None

    def add(self, watcher: Stepped) -> None:
        """Step ``watcher`` from now on (starting the thread if there is none yet)."""
        with self._lock:
            self._watchers.append(watcher)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._wake.notify()

    def remove(self, watcher: Stepped) -> None:
        """Stop stepping ``watcher`` (a step already running finishes)."""
        with self._lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def _run(self) -> None:
        me = threading.current_thread()
        while self._thread is me:
            with self._lock:
                due = [w for w in self._watchers if w.due <= time.monotonic()]
                if not due:
                    if self._watchers:
                        self._wake.wait(max(0.0, min(w.due for w in self._watchers) - time.monotonic()))
                    else:
                        self._wake.wait()  # idle until a handler joins a round
                    continue
            for watcher in due:
                try:
                    watcher.step()
                except Exception:  # a bug here must be visible, not a silent end of heartbeats
                    log.exception("rendezvous %r: a heartbeat step failed", watcher.run_id)


_schedulers: weakref.WeakSet[HeartbeatScheduler] = weakref.WeakSet()
_shared: HeartbeatScheduler | None = None
_shared_lock = threading.Lock()


def shared_scheduler() -> HeartbeatScheduler:
    """The process's heartbeat scheduler, created on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = HeartbeatScheduler()
        return _shared


def _after_fork_in_child() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()
    for scheduler in list(_schedulers):
        scheduler._reset()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork to survive
    os.register_at_fork(after_in_child=_after_fork_in_child)


#: Seconds a node that serves the store and is stopped (a signal) still serves it for the others
#: to leave: they learned the job is over from the rendezvous, and leave within a check or two.
STOPPED_GRACE = 2.0


def await_departures(
    ops: StoreOps,
    keys: RendezvousKeys,
    m: Membership,
    lost_nodes: Callable[[], list[str]],
    close_timeout: float,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Return once every participant of round ``m`` but this node has left.

    A participant has left once its heartbeat counter carries the "left" mark (its last write
    to the store). Participants that ``lost_nodes()`` names are not waited for; nobody is
    waited for longer than ``close_timeout`` seconds, nor, once ``stop()`` is true (this node
    is being stopped), longer than :data:`STOPPED_GRACE` from then.
    """
    pending = [rank for rank in range(m.size) if rank != m.rank]
    deadline = time.monotonic() + close_timeout
    stopping = False
    pause = 0.01
    while pending:
        if not stopping and stop is not None and stop():
            stopping = True
            if deadline > time.monotonic() + STOPPED_GRACE:
                deadline = time.monotonic() + STOPPED_GRACE
                close_timeout = STOPPED_GRACE
            log.info("rendezvous %r: stopping; serving the store %g s more for the other nodes to leave",
                     ops.run_id, STOPPED_GRACE)
        try:
            lost = set(lost_nodes())
            # The participants' names are read (once) only when some node was reported lost.
            pending = [
                rank
                for rank in pending
                if not (lost and m.ids[rank] in lost) and not has_left(ops.add(keys.heartbeat(m.round, rank), 0))
            ]
        except (RendezvousError, StoreError) as exc:
            log.warning("rendezvous %r: cannot tell whether every node has left: %s", ops.run_id, exc)
            return
        if not pending:
            return
        now = time.monotonic()
        if now >= deadline:
            log.warning(
                "rendezvous %r: %d node(s) had not left after %g s (%s): %s; stopping the store",
                ops.run_id,
                len(pending),
                close_timeout,
                "this node is stopped" if stopping else "close_timeout",
                list_ids([m.ids[rank] for rank in pending]),
            )
            return
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 2, 0.2)


def await_hangups(server: Any, grace: float) -> None:
    """Return once ``server`` (a :class:`~launcher.store.server.StoreServer`) holds no connection
    but this node's own, or ``grace`` seconds passed: the nodes that waited with a stopped host
    in no round leave when they read that the job is closed, and no membership says who they are."""
    deadline = time.monotonic() + grace
    while server.client_count > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
