"""A fake GPU timeline with CUDA's event semantics, for the straggler timing's CUDA-event path.

No GPU here: :class:`FakeGpu` stands in for one through the interface the real
:class:`launcher.stragglers.gpu_timeline.CudaClock` gives (``new_event``, ``capturing``), with
events that behave as ``torch.cuda.Event(enable_timing=True)`` does:

* ``record()`` puts a marker at the end of the work queued so far on the *current* stream;
* ``query()`` is true once the GPU has run every earlier piece of work on that stream (never blocks);
* ``elapsed_time(end)`` gives milliseconds between two completed events and raises, as CUDA's
  ``cudaErrorNotReady`` does, when either is not complete (or was never recorded).

Work is queued as kernels of a given length (``launch``); a stream can wait for an event of
another (``wait_event``), as NCCL's stream waits for the compute stream. The GPU runs only when the
test says so (``advance``). Every ``synchronize`` (stream, event, device) is recorded in
``synchronized``: the code under test must leave it empty.
"""

from __future__ import annotations

from launcher.stragglers.gpu_timeline import EventClock


class FakeStream:
    def __init__(self, gpu: FakeGpu, name: str) -> None:
        self.gpu = gpu
        self.name = name
        #: GPU time (ms) at which the work queued so far on this stream is done.
        self.queued_until = 0.0

    def launch(self, ms: float) -> None:
        """Queue a kernel of ``ms`` milliseconds (it starts once the earlier work is done)."""
        self.queued_until = max(self.queued_until, self.gpu.now) + ms

    def wait_event(self, event: FakeEvent) -> None:
        """Later work on this stream starts after ``event`` (cudaStreamWaitEvent: nothing blocks)."""
        self.queued_until = max(self.queued_until, event.at)

    def synchronize(self) -> None:
        self.gpu.synchronized.append(f"stream {self.name}")


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.at: float | None = None
        self.records = 0

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream or self.gpu.current
        self.at = max(stream.queued_until, self.gpu.now)
        self.records += 1
        self.gpu.recorded.append(self)

    def query(self) -> bool:
        self.gpu.queries += 1
        return self.at is not None and self.gpu.now >= self.at

    def elapsed_time(self, end: FakeEvent) -> float:
        if self.at is None or end.at is None:
            raise RuntimeError("CUDA error: an event was not recorded")
        if self.gpu.now < self.at or self.gpu.now < end.at:
            self.gpu.early_reads += 1
            raise RuntimeError("CUDA error: device not ready")
        return end.at - self.at

    def synchronize(self) -> None:
        self.gpu.synchronized.append("event")


class FakeGpu(EventClock):
    """One fake device: streams, events, and a clock that moves only on :meth:`advance`."""

    def __init__(self) -> None:
        self.now = 0.0
        self.compute = FakeStream(self, "compute")
        self.current = self.compute
        self.capture = False
        self.synchronized: list[str] = []
        self.recorded: list[FakeEvent] = []
        self.created = 0
        self.queries = 0
        self.early_reads = 0

    def stream(self, name: str) -> FakeStream:
        return FakeStream(self, name)

    def advance(self, ms: float) -> None:
        """Let the GPU run for ``ms`` milliseconds."""
        self.now += ms

    def run_all(self) -> None:
        """Let the GPU run until every stream's queued work is done (the test knows which)."""
        self.now = max(self.now, self.compute.queued_until)

    # The EventClock interface (what CudaClock gives over torch.cuda).
    def new_event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)

    def capturing(self) -> bool:
        return self.capture

    def synchronize(self) -> None:
        self.synchronized.append("device")


class FakeCudaTensor:
    """What the timing code looks at of a tensor: where it lives."""

    is_cuda = True
