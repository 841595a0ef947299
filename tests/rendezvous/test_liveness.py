"""The heartbeat scheduler as an object: its own thread, started lazily, reset in a forked child."""

from __future__ import annotations

import os
import threading
import time

import pytest
from launcher.rendezvous.liveness import HeartbeatScheduler, shared_scheduler

pytestmark = pytest.mark.timeout(30)


class _CountingWatcher:
    """Stands in for a RingWatcher: counts its steps, due every ``tick`` seconds."""

    run_id = "test"

    def __init__(self, tick: float = 0.01) -> None:
        self.tick = tick
        self.due = time.monotonic()
        self.steps = 0
        self.stepped = threading.Event()

    def step(self) -> None:
        self.steps += 1
        self.due = time.monotonic() + self.tick
        self.stepped.set()


def test_the_shared_scheduler_is_one_object_per_process() -> None:
    assert shared_scheduler() is shared_scheduler()
    assert isinstance(shared_scheduler(), HeartbeatScheduler)


def test_a_scheduler_starts_its_thread_with_the_first_watcher_and_stops_stepping_removed_ones() -> None:
    scheduler = HeartbeatScheduler(name="test-heartbeat")
    assert not any(t.name == "test-heartbeat" for t in threading.enumerate())
    watcher = _CountingWatcher()
    scheduler.add(watcher)
    assert watcher.stepped.wait(5)
    assert [t for t in threading.enumerate() if t.name == "test-heartbeat"]
    scheduler.remove(watcher)
    time.sleep(0.05)  # a step already under way may finish
    steps = watcher.steps
    time.sleep(0.1)
    assert watcher.steps == steps
    # A second watcher reuses the running thread.
    other = _CountingWatcher()
    scheduler.add(other)
    assert other.stepped.wait(5)
    assert len([t for t in threading.enumerate() if t.name == "test-heartbeat"]) == 1
    scheduler.remove(other)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_empty_schedulers_and_can_use_them() -> None:
    scheduler = HeartbeatScheduler(name="test-heartbeat-fork")
    parent_watcher = _CountingWatcher()
    scheduler.add(parent_watcher)
    assert parent_watcher.stepped.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: none of the parent's watchers, and a thread of its own once given one
        code = 1
        try:
            if not scheduler._watchers and scheduler._thread is None:
                mine = _CountingWatcher()
                scheduler.add(mine)
                code = 0 if mine.stepped.wait(5) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    scheduler.remove(parent_watcher)
    assert os.waitstatus_to_exitcode(status) == 0
