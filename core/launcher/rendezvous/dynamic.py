"""The core's rendezvous algorithm: elastic membership over any key-value store.

Every node does a constant number of store operations per round, whatever the number of nodes:
an atomic ``add`` hands out join order, each node writes only its own keys, and one node, the
*closer*, writes a single ``sealed`` key that fixes the round's participants and their ranks. No
shared record is rewritten by compare-and-set in a loop, which is what makes torchrun's c10d
rendezvous slow down sharply with node count. Liveness is a ring: each participant writes a
heartbeat counter and watches the counter of the next participant only.

The protocol (rounds, keys, who closes a round, rank assignment, liveness, failure cases) is
written down in ``docs/rendezvous.md``; the comments here refer to it.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

from launcher.rendezvous.api import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.store.api import KeyValueStore, StoreError, StoreTimeoutError

__all__ = [
    "KEY_ROOT",
    "DynamicRendezvousHandler",
    "NodeDescriptor",
    "handler_over_store",
]

log = logging.getLogger("launcher.rendezvous")

T = TypeVar("T")

#: Every key of the core's rendezvous starts with ``KEY_ROOT/<quoted run id>/``.
KEY_ROOT = "launcher/rdzv"

# Added to a heartbeat counter by a node that leaves its round on purpose, so that its watcher
# can tell "left" from "stopped beating" with the read it already does.
_LEFT = 1 << 40
_CLOSED = b"closed"
# Blocking waits are cut into slices so that other threads sharing the store connection
# (heartbeats, the agent's polls) are never locked out for long.
_WAIT_SLICE = 1.0
# Names shown in one progress or error message, at most.
_MAX_NAMES = 16

_local_ids = itertools.count()


@dataclass(frozen=True, order=True)
class NodeDescriptor:
    """Who a node is: its address, process id and a per-process counter.

    ``id`` (``addr_pid_n``) names the node in participants lists, logs and errors.
    """

    addr: str
    pid: int
    local_id: int

    @property
    def id(self) -> str:
        """``addr_pid_n``."""
        return f"{self.addr}_{self.pid}_{self.local_id}"

    @classmethod
    def generate(cls, local_addr: str | None = None) -> NodeDescriptor:
        """A descriptor unique to this handler: several handlers in one process never share one."""
        return cls(local_addr or socket.getfqdn(), os.getpid(), next(_local_ids))


@dataclass(frozen=True)
class _Membership:
    """This node's place in a sealed round."""

    round: int
    rank: int
    ids: list[str]
    local_world_sizes: list[int | None]
    #: Join indexes 1..count were considered by the closer; later ones are waiting.
    count: int
    #: Group rank of the participant that serves the store, if one does.
    host_rank: int | None = None


class _Keys:
    """Key names (see "Keys" in docs/rendezvous.md)."""

    def __init__(self, run_id: str) -> None:
        # Quoting keeps a run id containing "/" from reaching into another run's keys.
        self.base = f"{KEY_ROOT}/{quote(run_id, safe='')}"
        self.closed = f"{self.base}/closed"
        self.current = f"{self.base}/current"

    def round(self, r: int) -> str:
        return f"{self.base}/{r}"

    def open(self, r: int) -> str:
        return f"{self.base}/{r}/open"

    def seq(self, r: int) -> str:
        return f"{self.base}/{r}/seq"

    def node(self, r: int, index: int) -> str:
        return f"{self.base}/{r}/node/{index}"

    def sealed(self, r: int) -> str:
        return f"{self.base}/{r}/sealed"

    def rejoin(self, r: int) -> str:
        return f"{self.base}/{r}/rejoin"

    def heartbeat(self, r: int, rank: int) -> str:
        return f"{self.base}/{r}/hb/{rank}"

    def lost_count(self, r: int) -> str:
        return f"{self.base}/{r}/lost"

    def lost(self, r: int, k: int) -> str:
        return f"{self.base}/{r}/lost/{k}"

    def master(self, r: int) -> str:
        return f"{self.base}/{r}/master"

    def agent(self, r: int) -> str:
        return f"{self.base}/{r}/agent/"


class _Ops:
    """The store calls of one handler: one at a time (a lock), failures as RendezvousError."""

    def __init__(self, store: KeyValueStore, run_id: str, read_timeout: float) -> None:
        self.store = store
        self.lock = threading.RLock()
        self.run_id = run_id
        self.read_timeout = read_timeout

    def call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        with self.lock:
            try:
                return fn(*args)
            except StoreTimeoutError:
                if what == "wait":  # a wait that times out is an answer, handled by the caller
                    raise
                raise RendezvousError(
                    f"rendezvous {self.run_id!r}: the store did not answer a {what} within "
                    f"{self.read_timeout:g} s (read_timeout)"
                ) from None
            except StoreError as exc:
                raise RendezvousError(f"rendezvous {self.run_id!r}: the store failed during {what}: {exc}") from None

    def raw(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` under the lock, store errors unchanged (for the agent's round store)."""
        with self.lock:
            return fn(*args)

    def add(self, key: str, amount: int) -> int:
        return self.call("add", self.store.add, key, amount)

    def set(self, key: str, value: bytes) -> None:
        self.call("set", self.store.set, key, value)

    def get(self, key: str) -> bytes:
        """The value of ``key``, which must appear within the read timeout."""
        if not self.wait([key], self.read_timeout):
            raise RendezvousError(
                f"rendezvous {self.run_id!r}: the store key {key!r} did not appear within "
                f"{self.read_timeout:g} s (read_timeout): the node that writes it may have died"
            )
        return self.call("get", self.store.get, key, self.read_timeout)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self.call("compare_set", self.store.compare_set, key, expected, desired)

    def check(self, keys: Sequence[str]) -> bool:
        return self.call("check", self.store.check, list(keys))

    def multi_get(self, keys: Sequence[str], timeout: float) -> list[bytes]:
        """Values of ``keys`` once all exist; StoreTimeoutError after ``timeout`` seconds."""
        if not self.wait(keys, timeout):
            raise StoreTimeoutError(f"keys did not appear within {timeout:g} s")
        return self.call("multi_get", self.store.multi_get, list(keys), self.read_timeout)

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``keys``; whether they all exist."""
        end = time.monotonic() + max(timeout, 0.0)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return self.check(keys)
            try:
                self.call("wait", self.store.wait, list(keys), min(left, _WAIT_SLICE))
                return True
            except StoreTimeoutError:
                continue


class _RoundStore:
    """The store handed to the agent: a key prefix per round, sharing the handler's connection.

    Blocking calls wait in slices so that the heartbeat thread, which shares the connection,
    keeps beating while the agent waits at its exit barrier.
    """

    def __init__(self, ops: _Ops, prefix: str) -> None:
        self._ops = ops
        self.prefix = prefix

    def _k(self, key: str) -> str:
        return self.prefix + key

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``."""
        self._ops.raw(self._ops.store.set, self._k(key), value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists."""
        self.wait([key], timeout)
        return self._ops.raw(self._ops.store.get, self._k(key), self._ops.read_timeout)

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key``; the new value."""
        return self._ops.raw(self._ops.store.add, self._k(key), amount)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected``; the value now stored."""
        return self._ops.raw(self._ops.store.compare_set, self._k(key), expected, desired)

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Values of several keys, waiting until all exist."""
        self.wait(keys, timeout)
        return self._ops.raw(self._ops.store.multi_get, [self._k(k) for k in keys], self._ops.read_timeout)

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set several keys at once."""
        self._ops.raw(self._ops.store.multi_set, [self._k(k) for k in keys], list(values))

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, without waiting."""
        return self._ops.raw(self._ops.store.check, [self._k(k) for k in keys])

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key exists (``timeout`` ``None``: the read timeout)."""
        limit = self._ops.read_timeout if timeout is None else timeout
        names = [self._k(k) for k in keys]
        end = time.monotonic() + max(limit, 0.0)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                if self._ops.raw(self._ops.store.check, names):
                    return
                raise StoreTimeoutError(f"keys {list(keys)} did not appear within {limit:g} s")
            try:
                self._ops.raw(self._ops.store.wait, names, min(left, _WAIT_SLICE))
                return
            except StoreTimeoutError:
                continue

    def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        return self._ops.raw(self._ops.store.delete, self._k(key))

    def close(self) -> None:
        """Nothing to release: the connection belongs to the handler."""


def _names(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_MAX_NAMES])
    if len(ids) > _MAX_NAMES:
        shown += f" and {len(ids) - _MAX_NAMES} more"
    return shown


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RendezvousError(f"the rendezvous store holds a value this launcher cannot read: {raw[:80]!r}")
    return value


class _Watcher:
    """This node's heartbeat and its watch on the next participant, for one round.

    See "Liveness" in docs/rendezvous.md. Every ``keep_alive_interval`` it adds 1 to this node's
    heartbeat counter; every tick it reads the counter of the next participant in rank order. A
    counter that has not moved for ``liveness_timeout`` seconds of this node's clock (no clock is
    shared between hosts) makes that participant lost: it is published to the round's lost
    list, and the watcher moves on to the participant after it, so that the ring stays closed
    around the dead node. :class:`_HeartbeatThread` calls :meth:`step` when it is due.
    """

    def __init__(
        self,
        ops: _Ops,
        keys: _Keys,
        membership: _Membership,
        config: DynamicRendezvousConfig,
        on_lost: Callable[[str], None],
    ) -> None:
        self._ops = ops
        self._keys = keys
        self._m = membership
        self._config = config
        self._on_lost = on_lost
        self.tick = min(config.keep_alive_interval, config.liveness_timeout / 8, 1.0)
        now = time.monotonic()
        self.due = now + self.tick
        self._next_beat = now + config.keep_alive_interval
        self._watched = (membership.rank + 1) % len(membership.ids)
        self._last_value: int | None = None
        self._last_change = now
        self._failing = False
        # Held while a step runs, so that stop() returns only once no step is in flight.
        self._step_lock = threading.Lock()
        self._stopped = False

    def start(self) -> None:
        _HeartbeatThread.add(self)

    def stop(self) -> None:
        """No step runs after this returns (the caller then marks the node as left)."""
        _HeartbeatThread.remove(self)
        with self._step_lock:
            self._stopped = True

    def step(self) -> None:
        with self._step_lock:
            if not self._stopped:
                self._step()
            self.due = time.monotonic() + self.tick

    def _step(self) -> None:
        cfg, m = self._config, self._m
        r = m.round
        now = time.monotonic()
        try:
            if now >= self._next_beat:
                self._ops.add(self._keys.heartbeat(r, m.rank), 1)
                self._next_beat = now + cfg.keep_alive_interval
            if self._watched == m.rank:
                return  # every other participant is lost or gone: nobody left to watch
            value = self._ops.add(self._keys.heartbeat(r, self._watched), 0)
            if self._failing:
                log.info("rendezvous %r: the store answers again", self._ops.run_id)
                self._failing = False
        except (RendezvousError, StoreError) as exc:
            if not self._failing:
                log.warning("rendezvous %r: heartbeat failed: %s", self._ops.run_id, exc)
                self._failing = True
            return
        now = time.monotonic()
        if value >= _LEFT:
            self._move_on(now)
        elif value != self._last_value:
            self._last_value, self._last_change = value, now
        elif now - self._last_change > cfg.liveness_timeout:
            lost = m.ids[self._watched]
            log.warning(
                "rendezvous %r: node %s (group rank %d) sent no heartbeat for %.1f s: lost",
                self._ops.run_id,
                lost,
                self._watched,
                now - self._last_change,
            )
            try:
                k = self._ops.add(self._keys.lost_count(r), 1)
                self._ops.set(self._keys.lost(r, k), lost.encode())
            except (RendezvousError, StoreError) as exc:
                log.warning("rendezvous %r: could not publish the lost node: %s", self._ops.run_id, exc)
            self._on_lost(lost)
            self._move_on(now)

    def _move_on(self, now: float) -> None:
        self._watched = (self._watched + 1) % len(self._m.ids)
        self._last_value, self._last_change = None, now


class _HeartbeatThread:
    """One daemon thread per process runs the watchers of every handler in the process.

    An agent has one handler, so this is its heartbeat thread. It outlives rounds: a restart
    does not start a thread (which, with hundreds of simulated nodes sharing one interpreter
    lock, would cost more than the round itself). Restarted in a forked child.
    """

    _lock = threading.Lock()
    _wake = threading.Condition(_lock)
    _watchers: list[_Watcher] = []
    _pid: int | None = None

    @classmethod
    def add(cls, watcher: _Watcher) -> None:
        with cls._lock:
            cls._watchers.append(watcher)
            if cls._pid != os.getpid():
                cls._pid = os.getpid()
                threading.Thread(target=cls._run, name="launcher-rdzv-heartbeat", daemon=True).start()
            cls._wake.notify()

    @classmethod
    def remove(cls, watcher: _Watcher) -> None:
        with cls._lock:
            if watcher in cls._watchers:
                cls._watchers.remove(watcher)

    @classmethod
    def _after_fork(cls) -> None:
        # The child has no heartbeat thread and must not run its parent's watchers.
        cls._lock = threading.Lock()
        cls._wake = threading.Condition(cls._lock)
        cls._watchers = []
        cls._pid = None

    @classmethod
    def _run(cls) -> None:
        pid = os.getpid()
        while cls._pid == pid:
            with cls._lock:
                due = [w for w in cls._watchers if w.due <= time.monotonic()]
                if not due:
                    if cls._watchers:
                        cls._wake.wait(max(0.0, min(w.due for w in cls._watchers) - time.monotonic()))
                    else:
                        cls._wake.wait()  # idle until a handler joins a round
                    continue
            for watcher in due:
                try:
                    watcher.step()
                except Exception:  # a bug here must be visible, not a silent end of heartbeats
                    log.exception("rendezvous %r: a heartbeat step failed", watcher._ops.run_id)


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork to survive
    os.register_at_fork(after_in_child=_HeartbeatThread._after_fork)


class DynamicRendezvousHandler:
    """A :class:`~launcher.rendezvous.api.RendezvousHandler` running the core's algorithm.

    ``store`` is any :class:`~launcher.store.api.KeyValueStore` every node of the job reaches;
    the handler owns it and closes it on :meth:`shutdown`. ``is_host`` says this node serves
    the store (it then goes first in rank order with ``stable_rank0``). ``master_addr`` and
    ``master_port`` name a store the workers use in every round; leave them ``None`` (the default)
    and the agent of group rank 0 serves a fresh store for each round's workers (launcher's
    pure-Python TCPStore on a kernel-chosen port) and publishes its address: torch's workers add
    no per-attempt prefix to an agent store, so a store shared across rounds would hand a
    re-formed group the addresses of the previous group's dead ranks. ``local_world_size``
    (settable before each round) is shared with the other nodes and comes back in
    ``RendezvousInfo.local_world_sizes``.
    ``progress_interval`` is the period of "still waiting" messages on the
    ``launcher.rendezvous`` logger. ``on_shutdown`` runs once in :meth:`shutdown` (the c10d
    host stops its store server there). ``store_address`` (``host:port``) names the store in
    messages and lets :meth:`store_problem` probe it.

    A node that serves the store (``is_host``) keeps serving in :meth:`shutdown` until every
    other participant of its round has left (or is lost, or ``close_timeout`` passes): see
    "Leaving" in docs/rendezvous.md.
    """

    def __init__(
        self,
        store: KeyValueStore,
        *,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        config: DynamicRendezvousConfig | None = None,
        local_addr: str | None = None,
        is_host: bool = False,
        master_addr: str | None = None,
        master_port: int | None = None,
        local_world_size: int | None = None,
        backend_name: str = "dynamic",
        progress_interval: float = 10.0,
        on_shutdown: Callable[[], None] | None = None,
        store_address: str | None = None,
    ) -> None:
        if not run_id:
            raise RendezvousError("the rendezvous needs a non-empty run id (--rdzv-id)")
        if not 1 <= min_nodes <= max_nodes:
            raise RendezvousError(f"--nnodes {min_nodes}:{max_nodes} is invalid: need 1 <= MIN <= MAX")
        self._config = config or DynamicRendezvousConfig()
        self._run_id = run_id
        self._min = min_nodes
        self._max = max_nodes
        self._node = NodeDescriptor.generate(local_addr)
        self._is_host = is_host
        self._master_addr = master_addr
        self._master_port = master_port
        self.local_world_size = local_world_size
        self._backend_name = backend_name
        self.progress_interval = progress_interval
        self._on_shutdown = on_shutdown
        self._store_address = store_address
        self._store_gone = False
        #: Why this node's last next_rendezvous failed (shared by set_closed).
        self._failure: str | None = None
        self._keys = _Keys(run_id)
        self._ops = _Ops(store, run_id, self._config.read_timeout)
        self._current: _Membership | None = None
        self._was_rank0 = False
        self._watcher: _Watcher | None = None
        self._lost: list[str] = []
        self._lost_read = 0
        self._lost_lock = threading.Lock()
        self._closed = False
        self._shut_down = False
        self._workers_server: Any = None

    # -- facts -------------------------------------------------------------------------------

    @property
    def node(self) -> NodeDescriptor:
        """This node's descriptor (its ``id`` appears in ``participants``)."""
        return self._node

    @property
    def config(self) -> DynamicRendezvousConfig:
        """The validated settings."""
        return self._config

    def get_backend(self) -> str:
        """The backend name (``c10d``, or the store plugin's name)."""
        return self._backend_name

    def get_run_id(self) -> str:
        """The job id all nodes share."""
        return self._run_id

    # -- joining -----------------------------------------------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and return this node's place in it.

        Raises :class:`RendezvousClosedError` when the job is over, and
        :class:`RendezvousTimeoutError` when fewer than MIN nodes joined within ``join_timeout``.
        """
        if self._shut_down:
            raise RendezvousError(f"rendezvous {self._run_id!r}: this handler was shut down")
        deadline = time.monotonic() + self._config.join_timeout
        previous = self._current
        self._leave(rejoin=True)
        r = self._first_round(previous)
        outcome: _Membership | int = r
        try:
            while not isinstance(outcome, _Membership):
                outcome = self._attempt(outcome, deadline, previous)
        except RendezvousTimeoutError as exc:
            self._failure = str(exc)
            raise
        membership = outcome
        self._current = membership
        self._was_rank0 = membership.rank == 0
        with self._lost_lock:
            self._lost, self._lost_read = [], 0
        if len(membership.ids) > 1:
            self._watcher = _Watcher(self._ops, self._keys, membership, self._config, self._record_lost)
            self._watcher.start()
        master_addr, master_port, use_agent_store = self._workers_store(membership)
        log.info(
            "rendezvous %r: round %d formed with %d nodes; this node %s is group rank %d",
            self._run_id,
            membership.round,
            len(membership.ids),
            self._node.id,
            membership.rank,
        )
        sizes = [s for s in membership.local_world_sizes if s is not None]
        return RendezvousInfo(
            store=_RoundStore(self._ops, self._keys.agent(membership.round)),
            group_rank=membership.rank,
            group_world_size=len(membership.ids),
            master_addr=master_addr,
            master_port=master_port,
            use_agent_store=use_agent_store,
            round=membership.round,
            participants=list(membership.ids),
            # Only meaningful when every node said how many workers it runs.
            local_world_sizes=sizes if len(sizes) == len(membership.ids) else [],
        )

    def _first_round(self, previous: _Membership | None) -> int:
        current = self._read_current()
        if previous is not None and current <= previous.round:
            # This node was in the newest round: a new one is needed (a restart or a scale-up).
            return self._open(previous.round + 1)
        return current

    def _open(self, r: int) -> int:
        """Make round ``r`` the current one (if no one did); the current round afterwards."""
        raw = self._ops.compare_set(self._keys.current, str(r - 1).encode(), str(r).encode())
        if raw == _CLOSED:
            raise self._closed_error()
        value = int(raw)
        if value == r:
            # Wakes the nodes that wait for a round after r - 1 (see "Late nodes").
            self._ops.set(self._keys.open(r), b"1")
        return max(value, r)

    def _read_current(self) -> int:
        """The current round number, creating it (0) for the first node of the job.

        ``current`` holds ``closed`` once the job has ended, so this one read also tells a
        late node to leave.
        """
        raw = self._ops.compare_set(self._keys.current, b"", b"0")
        if raw == _CLOSED:
            self._closed = True
            raise self._closed_error()
        return int(raw)

    def _closed_error(self) -> RendezvousClosedError:
        why = ""
        try:
            if self._ops.check([self._keys.closed]):
                raw = self._ops.get(self._keys.closed)
                if raw not in (b"", b"1"):
                    why = f" ({raw.decode(errors='replace')})"
        except (RendezvousError, StoreError):
            pass  # the reason is a courtesy: the job has ended all the same
        return RendezvousClosedError(f"rendezvous {self._run_id!r} is closed: the job has ended{why}")

    def _node_record(self) -> bytes:
        return json.dumps(
            {
                "id": self._node.id,
                "addr": self._node.addr,
                "pid": self._node.pid,
                "lid": self._node.local_id,
                "host": self._is_host,
                "r0": self._was_rank0,
                "lws": self.local_world_size,
            },
            separators=(",", ":"),
        ).encode()

    def _attempt(self, r: int, deadline: float, previous: _Membership | None) -> _Membership | int:
        """Try to be a participant of round ``r``: this node's membership, or the round to try next."""
        index = self._ops.add(self._keys.seq(r), 1)
        if index > self._max:
            return self._wait_late(r, deadline, f"round {r} is full ({self._max} nodes)")
        self._ops.set(self._keys.node(r, index), self._node_record())
        log.info(
            "rendezvous %r: node %s joined round %d as number %d (min %d, max %d)",
            self._run_id,
            self._node.id,
            r,
            index,
            self._min,
            self._max,
        )
        now = time.monotonic()
        close_at = backup_at = math.inf
        grace = max(1.0, self._config.last_call_timeout / 2)
        if index == self._max:
            self._seal(r, self._max)  # the round is full: close it at once
        elif index == self._min:
            close_at = now + self._config.last_call_timeout  # this node closes after the last call
        elif index > self._min:
            backup_at = now + self._config.last_call_timeout + grace
        next_progress = now + self.progress_interval
        while True:
            now = time.monotonic()
            wake = min(deadline, next_progress, close_at, backup_at)
            if self._ops.wait([self._keys.sealed(r)], wake - now):
                return self._after_sealed(r, index, deadline)
            now = time.monotonic()
            if now >= deadline:
                return self._join_timed_out(r, index, deadline, previous)
            if now >= close_at or now >= backup_at:
                count = self._ops.add(self._keys.seq(r), 0)
                self._seal(r, min(count, self._max))
                close_at = backup_at = math.inf
                continue
            if now >= next_progress:
                next_progress = now + self.progress_interval
                self._raise_if_closed()
                count = self._ops.add(self._keys.seq(r), 0)
                if count >= self._min and backup_at == math.inf and close_at == math.inf:
                    # Quorum is reached but this node is not its closer: close later if the closer
                    # has died in the meantime.
                    backup_at = now + self._config.last_call_timeout + grace
                self._report_progress(r, index, count, deadline, close_at, previous)

    def _report_progress(
        self,
        r: int,
        index: int,
        count: int,
        deadline: float,
        close_at: float,
        previous: _Membership | None,
    ) -> None:
        now = time.monotonic()
        if count >= self._min:
            when = f"closes in {max(0.0, close_at - now):.0f} s" if close_at < math.inf else "closes soon"
            log.info(
                "rendezvous %r round %d: %d nodes joined (min %d, max %d); the round %s unless %d join first",
                self._run_id,
                r,
                count,
                self._min,
                self._max,
                when,
                self._max,
            )
            return
        missing = ""
        if index == 1:  # one node per round looks up who is missing, so the cost stays O(1) per node
            names = self._missing(r, count, previous)
            if names:
                missing = f"; missing: {_names(names)}"
        log.info(
            "rendezvous %r round %d: waiting for nodes, %d joined of min %d (max %d)%s; timeout in %.0f s",
            self._run_id,
            r,
            count,
            self._min,
            self._max,
            missing,
            max(0.0, deadline - now),
        )

    def _missing(self, r: int, count: int, previous: _Membership | None) -> list[str] | None:
        """Participants of the previous round that have not joined round ``r``; None if unknown."""
        if previous is None:
            return None
        try:
            records = self._ops.multi_get([self._keys.node(r, k) for k in range(1, count + 1)], 1.0)
        except StoreTimeoutError:
            return None
        joined = {_decode(raw).get("id") for raw in records}
        return [node for node in previous.ids if node not in joined]

    def _seal(self, r: int, count: int) -> None:
        """Close round ``r`` with the nodes of join index 1..count (see "Closing a round")."""
        if self._ops.check([self._keys.sealed(r)]):
            return  # closed already (by another closer, or by set_closed)
        keys = [self._keys.node(r, k) for k in range(1, count + 1)]
        try:
            records = self._ops.multi_get(keys, self._config.read_timeout)
        except StoreTimeoutError:
            # A node died between taking its index and announcing itself: seal without it.
            present = [k for k in keys if self._ops.check([k])]
            records = self._ops.multi_get(present, self._config.read_timeout) if present else []
        nodes = [_decode(raw) for raw in records]
        if len(nodes) < self._min:
            value: dict[str, Any] = {
                "state": "aborted",
                "reason": f"only {len(nodes)} of {count} nodes announced themselves",
            }
        else:
            stable = self._config.stable_rank0
            # Deterministic order: every node would compute the same ranks from the same set.
            nodes.sort(
                key=lambda n: (
                    not (stable and n.get("host")),
                    not (stable and n.get("r0")),
                    str(n.get("addr")),
                    int(n.get("pid", 0)),
                    int(n.get("lid", 0)),
                )
            )
            hosts = [rank for rank, n in enumerate(nodes) if n.get("host")]
            value = {
                "state": "sealed",
                "count": count,
                "ids": [n["id"] for n in nodes],
                "lws": [n.get("lws") for n in nodes],
                "closer": self._node.id,
                "hr": hosts[0] if hosts else None,
            }
        self._ops.compare_set(self._keys.sealed(r), b"", json.dumps(value, separators=(",", ":")).encode())

    def _after_sealed(self, r: int, index: int, deadline: float) -> _Membership | int:
        state = _decode(self._ops.get(self._keys.sealed(r)))
        kind = state.get("state")
        if kind == "closed":
            raise self._closed_error()
        if kind == "aborted":
            log.info("rendezvous %r: round %d was abandoned (%s); trying again", self._run_id, r, state.get("reason"))
            return self._open(r + 1)
        ids: list[str] = state["ids"]
        try:
            rank = ids.index(self._node.id)
        except ValueError:
            if index <= int(state["count"]):
                # The closer counted this index but did not see this node's record in time:
                # take a new index so that the running nodes see one more node waiting.
                self._ops.add(self._keys.seq(r), 1)
            return self._wait_late(r, deadline, f"round {r} closed without this node")
        host_rank = state.get("hr")
        return _Membership(
            r,
            rank,
            ids,
            list(state.get("lws") or [None] * len(ids)),
            int(state["count"]),
            host_rank if isinstance(host_rank, int) else None,
        )

    def _wait_late(self, r: int, deadline: float, why: str) -> int:
        """Wait, counted as a waiting node of round ``r``, until round r + 1 opens; its number."""
        log.info(
            "rendezvous %r: %s; this node waits for the next round",
            self._run_id,
            why,
        )
        next_progress = time.monotonic() + self.progress_interval
        while True:
            now = time.monotonic()
            if self._ops.wait([self._keys.open(r + 1)], min(deadline, next_progress) - now):
                if self._ops.get(self._keys.open(r + 1)) == _CLOSED:
                    raise self._closed_error()
                return r + 1
            now = time.monotonic()
            if now >= deadline:
                self._ops.add(self._keys.seq(r), -1)  # no longer waiting: do not trigger a restart
                raise RendezvousTimeoutError(
                    f"rendezvous {self._run_id!r} timed out after {self._config.join_timeout:g} s: "
                    f"{why}, and its nodes did not start a new round to admit this node"
                )
            next_progress = now + self.progress_interval
            self._raise_if_closed()
            current = self._read_current()
            if current > r:  # the opener died between moving "current" and writing "open"
                return current
            log.info(
                "rendezvous %r: still waiting for round %d to end and admit this node; timeout in %.0f s",
                self._run_id,
                r,
                max(0.0, deadline - now),
            )

    def _join_timed_out(self, r: int, index: int, deadline: float, previous: _Membership | None) -> _Membership | int:
        count = self._ops.add(self._keys.seq(r), 0)
        if count >= self._min:
            # MIN nodes are here: close now rather than fail (last call is only a courtesy).
            self._seal(r, min(count, self._max))
            return self._after_sealed(r, index, deadline)
        missing = self._missing(r, count, previous)
        aborted = {"state": "aborted", "reason": f"{self._node.id} timed out"}
        got = _decode(
            self._ops.compare_set(self._keys.sealed(r), b"", json.dumps(aborted, separators=(",", ":")).encode())
        )
        if got.get("state") == "sealed" and self._node.id in got.get("ids", ()):
            return self._after_sealed(r, index, deadline)  # sealed at the last moment, with this node
        if got.get("state") == "closed":
            raise self._closed_error()
        message = (
            f"rendezvous {self._run_id!r} timed out after {self._config.join_timeout:g} s: "
            f"{count} of {self._min} required nodes joined round {r} (--nnodes {self._min}:{self._max})"
        )
        if missing:
            message += f"; missing since round {previous.round if previous else '?'}: {_names(missing)}"
        message += (
            ". Start the missing nodes, check that every node uses the same --rdzv-endpoint and "
            "--rdzv-id, or raise join_timeout"
        )
        raise RendezvousTimeoutError(message)

    def _workers_store(self, m: _Membership) -> tuple[str, int, bool]:
        if self._master_addr is not None and self._master_port is not None:
            return self._master_addr, self._master_port, True
        key = self._keys.master(m.round)
        self._stop_workers_store()  # last round's workers are gone; so is this node's role
        if m.rank == 0:
            from launcher.store.server import StoreServer

            addr = self._node.addr
            server = StoreServer("::" if ":" in addr else "0.0.0.0", 0)
            server.start()
            self._workers_server = server
            self._ops.set(key, json.dumps([addr, server.port]).encode())
            return addr, server.port, True
        addr, port = json.loads(self._ops.get(key))
        return str(addr), int(port), True

    def _stop_workers_store(self) -> None:
        server, self._workers_server = self._workers_server, None
        if server is not None:
            server.close()

    # -- while the workers run ---------------------------------------------------------------

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join a new round: restarts asked by participants, plus late nodes
        while the round has room for them (two store reads)."""
        m = self._current
        if m is None or self._shut_down:
            return 0
        late = max(0, self._ops.add(self._keys.seq(m.round), 0) - m.count)
        rejoin = self._ops.add(self._keys.rejoin(m.round), 0)
        room = max(0, self._max - len(m.ids))
        return rejoin + min(late, room)

    def lost_nodes(self) -> list[str]:
        """Participants of this round whose heartbeat is older than the liveness timeout.

        One store read per call while nothing is lost.
        """
        m = self._current
        if m is None or len(m.ids) == 1 or self._shut_down:
            return []
        count = self._ops.add(self._keys.lost_count(m.round), 0)
        if count > self._lost_read:
            try:
                records = self._ops.multi_get(
                    [self._keys.lost(m.round, k) for k in range(self._lost_read + 1, count + 1)], 1.0
                )
            except StoreTimeoutError:
                records = []  # a watcher is between counting and naming: read again next time
            else:
                self._lost_read = count
            for raw in records:
                self._record_lost(raw.decode())
        with self._lost_lock:
            return list(self._lost)

    def _record_lost(self, node_id: str) -> None:
        with self._lost_lock:
            if node_id not in self._lost:
                self._lost.append(node_id)

    # -- ending ------------------------------------------------------------------------------

    def is_closed(self) -> bool:
        """Whether some node closed the rendezvous (the job is over)."""
        if not self._closed and not self._shut_down:
            self._closed = self._ops.check([self._keys.closed])
        return self._closed

    def _raise_if_closed(self) -> None:
        if self.is_closed():
            raise self._closed_error()

    def set_closed(self) -> None:
        """Close the rendezvous for every node; waiting and late nodes get RendezvousClosedError."""
        # A node that ends the job because its own rendezvous failed says why, so that the nodes
        # it stops can name the cause (a lost node, say) instead of only "closed".
        reason = f"{self._node.id}: {self._failure}" if self._failure else "1"
        self._ops.set(self._keys.closed, reason.encode())
        raw = self._ops.compare_set(self._keys.current, b"", b"0")
        while raw != _CLOSED:
            # Swap the round number for "closed" (retried only if a round opens meanwhile), so
            # that a node arriving later learns it from the read it does anyway.
            current = int(raw)
            raw = self._ops.compare_set(self._keys.current, raw, _CLOSED)
            if raw == _CLOSED:
                # Wake whoever waits for this round to close or for the next one to open.
                self._ops.compare_set(self._keys.sealed(current), b"", json.dumps({"state": "closed"}).encode())
                self._ops.set(self._keys.open(current + 1), _CLOSED)
        self._closed = True

    def _leave(self, *, rejoin: bool) -> None:
        """Stop heartbeats and tell the round's other nodes that this node left on purpose."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        m, self._current = self._current, None
        if m is None:
            return
        try:
            self._ops.add(self._keys.heartbeat(m.round, m.rank), _LEFT)
            if rejoin:
                self._ops.add(self._keys.rejoin(m.round), 1)
        except (RendezvousError, StoreError) as exc:
            log.warning("rendezvous %r: could not announce leaving round %d: %s", self._run_id, m.round, exc)

    def _await_departures(self, m: _Membership) -> None:
        """On the store's host: serve until every other participant of round ``m`` has left.

        A participant has left once its heartbeat counter carries the "left" mark, which
        :meth:`_leave` adds as its last write. Participants the heartbeat ring reports lost are
        not waited for; nobody is waited for longer than ``close_timeout``. This node keeps
        heartbeating meanwhile, so the others' watchers do not report it lost.
        """
        pending = [rank for rank in range(len(m.ids)) if rank != m.rank]
        deadline = time.monotonic() + self._config.close_timeout
        pause = 0.01
        while pending:
            try:
                lost = set(self.lost_nodes())
                pending = [
                    rank
                    for rank in pending
                    if m.ids[rank] not in lost and self._ops.add(self._keys.heartbeat(m.round, rank), 0) < _LEFT
                ]
            except (RendezvousError, StoreError) as exc:
                log.warning("rendezvous %r: cannot tell whether every node has left: %s", self._run_id, exc)
                return
            if not pending:
                return
            now = time.monotonic()
            if now >= deadline:
                log.warning(
                    "rendezvous %r: %d node(s) had not left after %g s (close_timeout): %s; stopping the store",
                    self._run_id,
                    len(pending),
                    self._config.close_timeout,
                    _names([m.ids[rank] for rank in pending]),
                )
                return
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, 0.2)

    def abandon_store(self) -> None:
        """The store is gone (its host died): :meth:`shutdown` then writes nothing to it."""
        self._store_gone = True

    def store_location(self) -> str:
        """``the rendezvous store on host:port (node N)``, as messages name it."""
        where = f" on {self._store_address}" if self._store_address else ""
        m = self._current
        node = f" (node {m.host_rank})" if m is not None and m.host_rank is not None else ""
        return f"the rendezvous store{where}{node}"

    def store_problem(self, timeout: float = 2.0) -> str | None:
        """Why the store cannot be reached (a fresh TCP connect to it fails), or ``None``.

        Asked after a store call failed: tells a store that is gone (refused: nothing listens
        any more) or cut off (no answer) from a passing hiccup.
        """
        if not self._store_address:
            return None
        from launcher.rendezvous.endpoint import parse_endpoint

        host, port = parse_endpoint(self._store_address, 0)
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return None
        except TimeoutError:
            return f"no answer within {timeout:g} s (host down or network cut)"
        except OSError as exc:
            return exc.strerror or str(exc) or type(exc).__name__

    def shutdown(self) -> bool:
        """Leave the round, close the store (and stop serving it, on the host).

        Leaving is this node's last write to the store. The host first waits for the others to
        leave (see :meth:`_await_departures`), so nobody's last write meets a closed store.
        """
        if self._shut_down:
            return True
        ok = True
        if self._store_gone:
            if self._watcher is not None:
                self._watcher.stop()
                self._watcher = None
            self._current = None
        elif self._is_host and self._current is not None:
            self._await_departures(self._current)
        try:
            self._leave(rejoin=False)
        except Exception as exc:  # shutting down must not raise
            log.warning("rendezvous %r: shutdown: %s", self._run_id, exc)
            ok = False
        self._shut_down = True
        self._stop_workers_store()
        try:
            self._ops.store.close()
        finally:
            callback, self._on_shutdown = self._on_shutdown, None
            if callback is not None:
                callback()
        return ok


def handler_over_store(
    store: KeyValueStore,
    params: RendezvousParameters,
    *,
    known_keys: Iterable[str] | None = None,
    **options: Any,
) -> DynamicRendezvousHandler:
    """The core's rendezvous over a store plugin's ``store`` (a ``create_store`` backend).

    ``known_keys`` lists the ``--rdzv-conf`` keys allowed (``None``: do not check, the plugin's
    own keys share the mapping). ``options`` go to :class:`DynamicRendezvousHandler`.
    """
    config = DynamicRendezvousConfig.from_parameters(params, known=known_keys)
    return DynamicRendezvousHandler(
        store,
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        config=config,
        local_addr=params.local_addr,
        backend_name=params.backend,
        **options,
    )
