"""Straggler timing on the GPU's timeline (CUDA events), driven by a fake GPU with CUDA's event semantics.

What a GPU run proves with real events (tests/gpu/test_stragglers_gpu.py), these prove here through
the same interface: a pending event is never read, nothing synchronizes, totals add up, a DDP comm
hook's future is timed to its completion, and the agent reads it all from the same slot.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from launcher.stragglers import timing
from launcher.stragglers.gpu_timeline import EventTimeline
from launcher.stragglers.slots import TimingTable

from tests.stragglers.fake_gpu import FakeCudaTensor, FakeGpu


def nccl_like(gpu: FakeGpu, ms: float):
    """A blocking collective as NCCL's: queued on its own stream, which waits for the compute stream;
    the compute stream then waits for it; returns at once (the host never waits)."""
    nccl = gpu.stream("nccl")

    def all_reduce(tensor, group=None, async_op=False):
        ready = gpu.new_event()
        ready.record(gpu.current)
        nccl.wait_event(ready)
        nccl.launch(ms)
        done = gpu.new_event()
        done.record(nccl)
        gpu.current.wait_event(done)

    return all_reduce


@pytest.fixture
def slot(tmp_path, monkeypatch):
    """This process as a worker measuring into slot 0 of a real straggler file; the agent's table."""
    table = TimingTable(str(tmp_path / "timings"), 1)
    monkeypatch.setenv(timing.STRAGGLER_FILE_ENV, table.path)
    monkeypatch.setenv(timing.STRAGGLER_SLOT_ENV, "0")
    monkeypatch.setenv(timing.STRAGGLER_PID_ENV, str(os.getpid()))
    for name, value in (("_state", None), ("_mapping", None), ("_wait", 0.0), ("_count", 0), ("_steps", 0),
                        ("_depth", 0), ("_timeline", None)):
        monkeypatch.setattr(timing, name, value)
    yield table
    table.close()


@pytest.fixture
def gpu(slot, monkeypatch):
    fake = FakeGpu()
    monkeypatch.setattr(timing, "_timeline", EventTimeline(fake))
    return fake


def test_pending_events_are_not_read_until_the_gpu_passed_them():
    gpu = FakeGpu()
    timeline = EventTimeline(gpu)
    gpu.compute.launch(5.0)  # this rank's compute, queued before the collective
    start = timeline.begin()
    gpu.compute.launch(3.0)  # the collective (waiting for the slowest rank, then the transfer)
    timeline.end(start)
    assert timeline.pending == 1 and not timeline.collect() and timeline.count == 0
    gpu.advance(6.0)  # the start passed, the end not
    assert not timeline.collect() and timeline.count == 0 and timeline.pending == 1
    gpu.advance(2.0)
    assert timeline.collect() and timeline.count == 1 and timeline.pending == 0
    assert timeline.seconds == pytest.approx(0.003)
    assert gpu.early_reads == 0 and gpu.synchronized == []


def test_totals_accumulate_in_order_and_events_are_reused():
    gpu = FakeGpu()
    timeline = EventTimeline(gpu)
    for compute, inside in ((4.0, 1.0), (2.0, 7.0), (1.0, 0.5)):
        gpu.compute.launch(compute)
        start = timeline.begin()
        gpu.compute.launch(inside)
        timeline.end(start)
    gpu.advance(4.0 + 1.0 + 2.0)  # the first collective done, the second queued behind it
    timeline.collect()
    assert (timeline.count, timeline.pending) == (1, 2)
    gpu.run_all()
    timeline.collect()
    assert (timeline.count, timeline.pending) == (3, 0)
    assert timeline.seconds == pytest.approx(0.0085)
    created = gpu.created
    start = timeline.begin()
    timeline.end(start)
    assert gpu.created == created  # events come back from the pool, not from new cudaEventCreate calls
    assert gpu.early_reads == 0 and gpu.synchronized == []


def test_capture_and_a_full_queue_go_untimed_and_a_failed_call_returns_its_event():
    gpu = FakeGpu()
    timeline = EventTimeline(gpu, max_pending=2)
    gpu.capture = True
    assert timeline.begin() is None and timeline.skipped == 1  # no timing event inside a graph capture
    gpu.capture = False
    for _ in range(2):
        timeline.end(timeline.begin())
    assert timeline.begin() is None and timeline.skipped == 2 and timeline.pending == 2  # the GPU far behind
    gpu.run_all()
    timeline.collect()
    start = timeline.begin()
    timeline.cancel(start)  # the collective raised before it was queued
    assert timeline.pending == 0 and timeline.count == 2


def test_a_blocking_collective_on_cuda_tensors_is_timed_on_the_gpu_not_the_host(slot, gpu):
    all_reduce = timing._timed(nccl_like(gpu, 3.0), 2)
    gpu.compute.launch(5.0)
    all_reduce(FakeCudaTensor())
    # Queued, not done: the host went on at once, and the slot shows it pending, not finished.
    totals = slot.read_all()[0]
    assert (totals.collectives, totals.gpu_collectives, totals.gpu_pending, totals.entered) == (0, 0, 1, 0.0)
    assert totals.active and totals.clock == "gpu"
    gpu.compute.launch(5.0)
    all_reduce(tensor=[FakeCudaTensor()])  # by keyword, a list of tensors: the same clock
    gpu.advance(8.0)  # the first collective's end passed, the second not queued to run yet
    timing.record_step(1)  # launcher.heartbeat(step) reads the events that completed
    totals = slot.read_all()[0]
    assert (totals.collectives, totals.gpu_collectives, totals.gpu_pending) == (1, 1, 1)
    assert totals.wait == pytest.approx(0.003)
    gpu.run_all()
    timing.record_step(2)
    totals = slot.read_all()[0]
    assert (totals.collectives, totals.gpu_collectives, totals.gpu_pending, totals.steps) == (2, 2, 0, 2)
    assert totals.wait == pytest.approx(0.006)
    assert gpu.early_reads == 0 and gpu.synchronized == []


def test_cpu_tensors_and_barriers_keep_the_wall_clock(slot, gpu):
    torch = pytest.importorskip("torch")
    seen = []

    def all_reduce(tensor, group=None, async_op=False):
        seen.append(slot.read_all()[0].entered)  # in progress on the host's clock

    def barrier(group=None, async_op=False, device_ids=None):
        seen.append(slot.read_all()[0].entered)

    timing._timed(all_reduce, 2)(torch.ones(2))
    timing._timed(barrier, 1)()
    totals = slot.read_all()[0]
    assert all(seen) and (totals.collectives, totals.gpu_collectives, totals.clock) == (2, 0, "host")
    assert gpu.recorded == []


def test_a_ddp_comm_hook_is_timed_to_its_future_completion(slot, gpu):
    torch = pytest.importorskip("torch")
    nccl = gpu.stream("nccl")
    futures = []

    def hook(state, bucket):  # a user's hook: queues the all-reduce, returns a future not done yet
        ready = gpu.new_event()
        ready.record()
        nccl.wait_event(ready)
        nccl.launch(4.0)
        future = torch.futures.Future()
        futures.append(future)
        return future

    class Bucket:
        def is_last(self):
            return True

        def buffer(self):
            return FakeCudaTensor()

    timed = timing._timed_hook(hook)
    gpu.compute.launch(2.0)  # the backward pass up to the last bucket
    result = timed(None, Bucket())
    starts = len(gpu.recorded)
    assert slot.read_all()[0].gpu_pending == 0  # only the start is marked: the end comes with the future
    # The collective completes: as torch does, the callback runs on a stream that waits for it.
    done = gpu.new_event()
    done.record(nccl)
    callback = gpu.stream("callback")
    callback.wait_event(done)
    gpu.current = callback
    futures[0].set_result("grads")
    assert result.wait() == "grads"
    assert len(gpu.recorded) == starts + 2 and gpu.recorded[-1].at == pytest.approx(6.0)  # at the all-reduce's end
    assert slot.read_all()[0].gpu_pending == 1
    gpu.advance(5.0)
    timing.record_step(1)
    assert slot.read_all()[0].collectives == 0  # not there yet: nothing waited for it
    gpu.advance(1.0)
    timing.record_step(2)
    totals = slot.read_all()[0]
    assert (totals.collectives, totals.gpu_collectives, totals.gpu_pending) == (1, 1, 0)
    assert totals.wait == pytest.approx(0.004)
    assert gpu.early_reads == 0 and gpu.synchronized == []


def test_a_hook_that_raises_leaves_nothing_pending(slot, gpu):
    class Bucket:
        def is_last(self):
            return True

        def buffer(self):
            return FakeCudaTensor()

    def hook(state, bucket):
        raise RuntimeError("the user's hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        timing._timed_hook(hook)(None, Bucket())
    totals = slot.read_all()[0]
    assert (totals.gpu_pending, totals.collectives) == (0, 0) and timing._timeline.pending == 0


def test_the_worker_loads_the_gpu_timeline_from_beside_its_timing_file(slot, monkeypatch):
    # As the start-up hook does: timing.py loaded by path, launcher not importable from it.
    pytest.importorskip("torch")
    path = os.path.join(os.path.dirname(timing.__file__), "timing.py")
    spec = importlib.util.spec_from_file_location("_launcher_straggler_timing_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.delitem(sys.modules, module._GPU_MODULE, raising=False)
    timeline = module._gpu_timeline()
    assert type(timeline).__name__ == "EventTimeline" and type(timeline.clock).__name__ == "CudaClock"
    assert sys.modules[module._GPU_MODULE].__file__.endswith(os.path.join("stragglers", "gpu_timeline.py"))
