"""The worker's side of straggler detection: how long this rank waits in collectives.

Collectives equalize wall-clock time: in a data-parallel job every rank's step takes as long as
the slowest rank's, so step times name nobody. What differs is where the time goes. A fast rank
finishes its work early and *waits* in the collective for the slow one; the slow rank arrives
last and hardly waits. This module measures, per rank, the seconds spent inside collectives
(``wait``, which includes the transfer itself, the same for every rank) and the number of
collectives; the agent derives the time spent outside them (``work``) from the wall clock.

Under launcher with ``--straggler-detection`` the agent loads this file into every worker at
start-up (``launcher/hangs/_site/sitecustomize.py`` runs :func:`install`). It then waits for the
*user's* code to import ``torch.distributed`` (a meta-path hook: nothing is imported early) and
wraps, in place:

* the blocking collectives of ``torch.distributed`` (``all_reduce``, ``broadcast``,
  ``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``,
  ``all_to_all``, ``all_to_all_single``, ``reduce``, ``gather``, ``scatter``, ``barrier``,
  ``monitored_barrier``). A call with ``async_op=True`` only enqueues: it is passed through
  untimed (its wait happens at ``work.wait()``);
* DDP's gradient all-reduce, which the C++ reducer issues without Python: every communication
  hook registered through ``DistributedDataParallel.register_comm_hook`` is wrapped, and a DDP
  module that has none at its first ``forward`` gets one that does what DDP's default does
  (the mean of the gradients, as torch's ``default_hooks.allreduce_hook``). The wait of a
  backward pass is the time from the launch of its last bucket (the end of this rank's backward
  compute) to that bucket's result.

Which clock times a collective depends on where its data lives. On CPU tensors (gloo) a blocking
collective returns when it is over: two ``time.monotonic()`` calls around it. On CUDA tensors
(NCCL, or gloo on CUDA tensors) a collective returns once queued, so the wall clock measures
nothing: timing events on the GPU's timeline measure it, read once complete, without
synchronizing anything (:mod:`launcher.stragglers.gpu_timeline`, loaded at the first collective
on a CUDA tensor). A collective without a tensor (``barrier``) blocks the host: the wall clock.
Either way ``wait`` is the time inside collectives and ``work`` (the agent's wall clock less
``wait``) the time outside them.

Slot layout (little-endian, :data:`SLOT_SIZE` bytes; the agent reads it with
:mod:`launcher.stragglers.slots`)::

    0   float64  seconds spent in finished collectives (both clocks)
    8   float64  start of the host-timed collective in progress, CLOCK_MONOTONIC (0: none)
    16  int64    collectives finished (both clocks)
    24  int64    last step given to launcher.heartbeat(step) (while the next field is 0: none)
    32  int64    heartbeat(step) calls
    40  float64  CLOCK_MONOTONIC of the last heartbeat(step)
    48  int64    of the collectives finished, those timed on the GPU's timeline
    56  int64    collectives timed on the GPU, queued, their events not complete yet

A GPU-timed collective enters the first and third fields once its events completed (seen at the
rank's next timed collective or ``heartbeat(step)``): it is never "in progress" at offset 8.
A host-timed collective costs two ``time.monotonic()`` calls (vDSO, no system call) and two
stores into the mapped page; a GPU-timed one two event records and one query per event pair
read: no lock, no system call of launcher's own. Only the worker process itself writes (its pid is
recorded in :data:`STRAGGLER_PID_ENV` at start-up; data-loader workers and other children
inherit it, find it is not theirs, and stay out).

**Progress for hang detection.** Under ``--hang-timeout`` the same hook (installed whenever the
worker's environment names a heartbeat file, :data:`HEARTBEAT_FILE_ENV`) counts as this rank's
progress, with no change to the job's code: every collective it times that completes (on the host's
clock when the call returns; on the GPU's once its end event is seen complete, never waiting for
it), every optimizer step (torch's global ``register_optimizer_step_post_hook``, registered
once the worker's own code imports ``torch.optim``), and every batch a ``DataLoader`` hands the
main thread (an evaluation pass: no step, maybe no collective per batch). Each stores the time into the rank's heartbeat
slot (offset 0, as ``launcher.heartbeat()`` does); an optimizer step also stores the count of
optimizer steps so far (offset :data:`OPTIMIZER_STEPS_OFFSET`), which gives ``launcher status``
its steps/s when the job gives no ``heartbeat(step)``. Without ``--straggler-detection`` nothing
is timed: the wrapped collectives only beat.

**Checkpoints as quiet sections.** Under ``--hang-timeout`` too, ``torch.save`` and
``torch.distributed.checkpoint``'s ``save``, ``async_save``, ``load`` and the legacy
``save_state_dict``/``load_state_dict`` are wrapped once the worker's code imports them (their
modules ``torch.serialization``, ``...checkpoint.state_dict_saver`` and ``state_dict_loader``):
each call on the main thread is a quiet section named ``checkpoint`` in the rank's heartbeat
slot, its deadline infinity (the agent applies its checkpoint timeout), counted once when nested
(DCP calls ``torch.save``) and not opened inside a section the job opened itself. At its end the
section's length goes into the slot (offset :data:`CHECKPOINTS_OFFSET`: the longest so far and
the count), which the agent learns the checkpoint timeout from. Outside a checkpoint this costs
nothing: no other function is wrapped.

Standard library only, importable by the worker's interpreter without launcher's agent (and
nothing newer than Python 3.8: the worker's interpreter may not be the agent's).
"""

from __future__ import annotations

# Nothing more: every worker's start pays for what is imported here (typing alone costs a few
# ms); functools is imported where a patch needs it, after the worker's torch imported it.
import os
import struct
import sys
import time

#: Path of the agent's straggler file (one slot per local worker).
STRAGGLER_FILE_ENV = "LAUNCHER_STRAGGLER_FILE"
#: This worker's slot in it (its local rank).
STRAGGLER_SLOT_ENV = "LAUNCHER_STRAGGLER_SLOT"
#: The pid of the one process that writes the slot (the worker, recorded at its start-up).
STRAGGLER_PID_ENV = "LAUNCHER_STRAGGLER_PID"
#: Path of this file, for the start-up hook (which cannot import launcher).
STRAGGLER_HOOK_ENV = "LAUNCHER_STRAGGLER_HOOK"
#: The heartbeat file, its slot and its writer (``launcher.hangs.heartbeat``, which this file
#: cannot import): set by ``--hang-timeout``; the hook then beats for the rank at its progress.
HEARTBEAT_FILE_ENV = "LAUNCHER_HEARTBEAT_FILE"
HEARTBEAT_SLOT_ENV = "LAUNCHER_HEARTBEAT_SLOT"
HEARTBEAT_PID_ENV = "LAUNCHER_HEARTBEAT_PID"
#: A heartbeat slot's size and where its optimizer-step count is (``launcher.hangs.heartbeat``).
HEARTBEAT_SLOT_SIZE = 128
OPTIMIZER_STEPS_OFFSET = 64

SLOT_SIZE = 64
_DONE = struct.Struct("<ddq")  # wait total, entered (0), count: one store at a collective's end
_ENTER = struct.Struct("<d")
_ENTER_OFFSET = 8
_STEP = struct.Struct("<qqd")
_STEP_OFFSET = 24
_WAIT = struct.Struct("<d")
_COUNT = struct.Struct("<q")
_COUNT_OFFSET = 16
_GPU = struct.Struct("<qq")  # GPU-timed collectives finished, pending
_GPU_OFFSET = 48
_BEAT = struct.Struct("<d")
_OPTIMIZER = struct.Struct("<q")

#: The blocking collectives of torch.distributed (name: wrapped when present in this torch).
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter",
               "barrier", "monitored_barrier")

_monotonic = time.monotonic
#: ``None`` before the first use; ``()`` when off; ``(page, offset)`` when on.
_state = None
_mapping = None
#: Running totals of this process's host-timed collectives (the slot holds these plus the GPU's).
_wait = 0.0
_count = 0
#: The GPU's timeline (:class:`launcher.stragglers.gpu_timeline.EventTimeline`): ``None`` before
#: the first collective on a CUDA tensor, ``False`` where it cannot be had.
_timeline = None
#: The name the GPU timeline's module is loaded under in the worker.
_GPU_MODULE = "_launcher_straggler_gpu_timeline"
_steps = 0
#: The heartbeat slot ``(page, offset)`` (``None``: not looked for yet; ``()``: no hang detection here).
_beat = None
#: Optimizer steps this process took (with ``--hang-timeout``).
_optimizer_steps = 0
#: Nesting depth: a collective built on others (all_gather_object) is timed once, outermost.
_depth = 0


def _forget_in_child():
    global _state, _mapping, _timeline, _beat, _optimizer_steps, _checkpoint_depth, _longest_checkpoint, _checkpoints
    _state = None
    _mapping = None
    _timeline = None
    _beat = None
    _optimizer_steps = 0
    _checkpoint_depth = 0
    _longest_checkpoint = 0.0
    _checkpoints = 0


def follow_new_attempt():
    """A recovery in place (``launcher.recovery.worker``) gave this process the next attempt's
    slot files: the next progress maps them, as a fresh worker's start-up would, and counts its
    optimizer steps from 0 again (the new slot's count, as after a restart)."""
    _forget_in_child()


def _open():
    """Map this worker's slots, once: the straggler slot (returned; ``()`` outside launcher, without
    ``--straggler-detection`` or in a child of the worker) and the heartbeat slot (:data:`_beat`)."""
    global _state, _beat
    _beat = _open_beat()
    _state = _open_timing()
    return _state


def _heartbeat_slot():
    """:data:`_beat`, this worker's slots mapped at its first progress (:func:`_open`)."""
    if _beat is None:
        _open()
    return _beat


def _open_beat():
    """This worker's heartbeat slot ``(page, offset)``; ``()`` without ``--hang-timeout`` or in a
    child of the worker (the same rules as ``launcher.heartbeat()``: only the recorded worker beats)."""
    path = os.environ.get(HEARTBEAT_FILE_ENV)
    slot = os.environ.get(HEARTBEAT_SLOT_ENV, "")
    if not path or not slot.isdigit() or os.environ.get(HEARTBEAT_PID_ENV) != str(os.getpid()):
        return ()
    beat = _map_slot(path, int(slot), HEARTBEAT_SLOT_SIZE)
    if not beat:
        return ()
    import atexit  # built in: nothing to load

    # The job's code is over: its end is progress too. torch's teardown at exit takes seconds
    # on a busy machine, and must not pass for a rank silent since its last step. (Registered
    # again after a recovery in place maps a new slot: unregistered first, so it runs once.)
    atexit.unregister(_exiting)
    atexit.register(_exiting)
    return beat


#: The quiet section a rank enters once the job's code is over (the slot's layout: launcher.hangs.heartbeat):
#: its deadline and start at offset 8, its name at offset 24. Teardown (torch's, NCCL's) is not a
#: step: seconds of it must not pass for a hang, yet a process stuck there is still caught.
_EXIT_QUIET = struct.Struct("<dd40s")
_EXIT_QUIET_OFFSET = 8
EXIT_QUIET_SECONDS = 120.0


def _exiting():
    beat = _beat
    if beat and os.environ.get(HEARTBEAT_PID_ENV) == str(os.getpid()):
        now = _monotonic()
        try:  # the page may be gone at exit
            _BEAT.pack_into(beat[0], beat[1], now)
            _EXIT_QUIET.pack_into(beat[0], beat[1] + _EXIT_QUIET_OFFSET, now + EXIT_QUIET_SECONDS, now, b"exiting")
        except (ValueError, TypeError, struct.error):
            pass


def _open_timing():
    """This worker's straggler slot ``(page, offset)``; ``()`` without ``--straggler-detection``
    or in a child of the worker."""
    global _mapping
    path = os.environ.get(STRAGGLER_FILE_ENV)
    slot = os.environ.get(STRAGGLER_SLOT_ENV, "")
    if not path or not slot.isdigit():
        return ()
    if not os.environ.get(STRAGGLER_PID_ENV):
        os.environ[STRAGGLER_PID_ENV] = str(os.getpid())
    if os.environ.get(STRAGGLER_PID_ENV) != str(os.getpid()):
        return ()  # a data-loader worker, a spawned child: not the rank's time
    mapped = _map_slot(path, int(slot), SLOT_SIZE)
    if mapped:
        _mapping = mapped[0]
    return mapped


def _map_slot(path, slot, size):
    """Slot ``slot`` (``size`` bytes each) of the shared file ``path``: ``(page, offset)``, or
    ``()`` when it cannot be mapped (watching and measuring must never break training)."""
    try:
        import mmap

        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            length = os.fstat(fd).st_size
            offset = slot * size
            if offset + size > length:
                return ()
            return (mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE), offset)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return ()


os.register_at_fork(after_in_child=_forget_in_child)


def enter():
    """A blocking collective begins: returns its start time (0.0 when not measuring)."""
    global _depth
    state = _state if _state is not None else _open()
    on = state or _beat
    if not on or _depth:
        _depth += 1 if on else 0
        return 0.0
    _depth = 1
    start = _monotonic()
    if state:
        _ENTER.pack_into(state[0], state[1] + _ENTER_OFFSET, start)
    return start


def leave(start):
    """The collective that began at ``start`` (from :func:`enter`) is over: a sign of progress
    (``--hang-timeout``) and, with ``--straggler-detection``, time spent waiting."""
    global _depth, _wait, _count
    state = _state
    beat = _beat
    if not (state or beat):
        return
    _depth = max(0, _depth - 1)
    if not start:
        return
    now = _monotonic()
    if beat:
        _BEAT.pack_into(beat[0], beat[1], now)
    if not state:
        return
    _wait += now - start
    _count += 1
    timeline = _timeline
    if timeline:
        _DONE.pack_into(state[0], state[1], _wait + timeline.seconds, 0.0, _count + timeline.count)
    else:
        _DONE.pack_into(state[0], state[1], _wait, 0.0, _count)


def _gpu_timeline():
    """This process's :class:`~launcher.stragglers.gpu_timeline.EventTimeline` (``None``: not measuring,
    or no CUDA timing events here)."""
    global _timeline
    state = _state if _state is not None else _open()
    if not (state or _beat):
        return None
    if _timeline is None:
        _timeline = False
        try:
            module = sys.modules.get(_GPU_MODULE)
            if module is None:
                import importlib.util

                # Beside this file: the worker may not have launcher importable (see the docstring).
                path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_timeline.py")
                spec = importlib.util.spec_from_file_location(_GPU_MODULE, path)
                if spec is None or spec.loader is None:
                    raise ImportError("no module at " + path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[_GPU_MODULE] = module
                spec.loader.exec_module(module)
            _timeline = module.EventTimeline(module.CudaClock())
        except Exception as exc:  # measuring must never break training
            sys.stderr.write("launcher: cannot time collectives on the GPU: " + str(exc) + "\n")
    return _timeline or None


def _publish_gpu(timeline):
    """Read the GPU's completed events into the slots (nothing waits for the pending ones): a
    collective seen complete is progress, the time of the look (``--hang-timeout``)."""
    state = _state
    if timeline.collect():
        beat = _beat
        if beat:
            _BEAT.pack_into(beat[0], beat[1], _monotonic())
        if state:
            page, offset = state
            _WAIT.pack_into(page, offset, _wait + timeline.seconds)
            _COUNT.pack_into(page, offset + _COUNT_OFFSET, _count + timeline.count)
    if state:
        _GPU.pack_into(state[0], state[1] + _GPU_OFFSET, timeline.count, timeline.pending)


def gpu_begin(timeline):
    """A blocking collective on CUDA tensors is about to be queued: a token for :func:`gpu_end`
    (``None`` when not timed: inside another timed collective, a graph capture, too many pending).
    ``timeline``: :func:`_gpu_timeline`'s."""
    global _depth
    if _depth:
        return None
    token = _gpu_start(timeline)
    if token is not None:
        _depth = 1
    return token


def gpu_end(token, queued=True):
    """The collective begun with ``token`` was queued (``queued``: False when it raised); the
    stream current now waits for its result."""
    global _depth
    if token is not None:
        _depth = 0
        _gpu_stop(_timeline, token, queued)


def _gpu_start(timeline):
    """Read the events of earlier collectives that completed meanwhile; mark a start on the current stream."""
    try:
        _publish_gpu(timeline)
        return timeline.begin()
    except Exception as exc:
        _give_up_gpu(exc)
        return None


def _gpu_stop(timeline, token, queued=True):
    """Mark the end of the collective begun with ``token`` on the current stream."""
    state = _state
    if token is None or not timeline or not (state or _beat):
        return
    try:
        if queued:
            timeline.end(token)
        else:
            timeline.cancel(token)
        if state:
            _GPU.pack_into(state[0], state[1] + _GPU_OFFSET, timeline.count, timeline.pending)
    except Exception as exc:
        _give_up_gpu(exc)


def _bucket_begin(tensor):
    """Time the all-reduce of DDP's last bucket ``tensor``: on the GPU's timeline for a CUDA
    bucket, else on the wall clock. A mark for :func:`_bucket_end`."""
    if getattr(tensor, "is_cuda", False) is True:
        timeline = _gpu_timeline()
        if timeline is not None:
            return timeline, _gpu_start(timeline)
    return None, enter()


def _bucket_end(mark, queued=True):
    """The bucket's all-reduce begun at ``mark`` is over: for a CUDA bucket, called in the
    future's ``then`` callback, whose current stream waits for the result (the end event goes
    there); or it never was queued (``queued`` False)."""
    timeline, token = mark
    if timeline is None:
        leave(token)
    else:
        _gpu_stop(timeline, token, queued)


def _give_up_gpu(exc):
    global _timeline
    _timeline = False
    sys.stderr.write("launcher: stopped timing collectives on the GPU: " + str(exc) + "\n")


def record_step(step):
    """``launcher.heartbeat(step)``: this rank reached ``step`` (precise mode)."""
    global _steps
    state = _state if _state is not None else _open()
    if state:
        _steps += 1
        _STEP.pack_into(state[0], state[1] + _STEP_OFFSET, int(step), _steps, _monotonic())
        timeline = _timeline
        if timeline:
            try:
                _publish_gpu(timeline)
            except Exception as exc:
                _give_up_gpu(exc)


def _timed(function, async_index):
    """``function`` (a blocking collective), timed unless called with ``async_op=True``."""

    import functools

    @functools.wraps(function)
    def timed(*args, **kwargs):
        if kwargs.get("async_op") or (async_index is not None and len(args) > async_index and args[async_index]):
            return function(*args, **kwargs)
        timeline = _gpu_timeline() if not _depth and _on_cuda(args, kwargs) else None
        if timeline is not None:
            token = gpu_begin(timeline)
            try:
                result = function(*args, **kwargs)
            except BaseException:
                gpu_end(token, queued=False)
                raise
            gpu_end(token)
            return result
        start = enter()
        try:
            return function(*args, **kwargs)
        finally:
            leave(start)

    timed.__dict__["_launcher_timed"] = True
    return timed


#: Where a collective's first tensor (or list of them) is passed by keyword.
_TENSOR_KEYWORDS = ("tensor", "output_tensor", "output", "tensor_list", "output_tensor_list")


def _on_cuda(args, kwargs):
    """Whether a collective's data are CUDA tensors (its first tensor argument, or the first of a list)."""
    value = args[0] if args else next((kwargs[k] for k in _TENSOR_KEYWORDS if k in kwargs), None)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return getattr(value, "is_cuda", False) is True


def _async_index(function):
    import inspect

    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("async_op") if "async_op" in names else None


def patch_collectives(dist):
    """Wrap the blocking collectives of ``torch.distributed`` (module ``dist``) in place."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    for name in COLLECTIVES:
        function = getattr(dist, name, None)
        if function is None or getattr(function, "_launcher_timed", False):
            continue
        timed = _timed(function, _async_index(function))
        setattr(dist, name, timed)
        # Collectives built on others (all_gather_object, ...) look them up in this module.
        if c10d is not None and getattr(c10d, name, None) is function:
            setattr(c10d, name, timed)


def _timed_hook(hook):
    """A DDP communication hook whose last bucket's wait is timed (the end of this rank's backward)."""

    def timed_hook(state, bucket):
        if not bucket.is_last():
            return hook(state, bucket)
        mark = _bucket_begin(bucket.buffer())
        try:
            future = hook(state, bucket)
        except BaseException:
            _bucket_end(mark, queued=False)
            raise

        def done(result):
            _bucket_end(mark)
            return result.value()

        return future.then(done)

    # DDP checks the hook's "bucket" parameter and its name (bf16 hooks): keep them.
    import functools

    functools.update_wrapper(timed_hook, hook)
    return timed_hook


def _mean_allreduce_hook(process_group, bucket):
    """What DDP does without a hook: the mean of each bucket over the group (as torch's
    ``default_hooks.allreduce_hook``), the last bucket's wait timed in the same callback (one
    Python callback a bucket, as torch's own Python hook: each costs a hand-over of the GIL)."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    if not bucket.is_last():
        return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(_first_tensor)
    mark = _bucket_begin(tensor)
    try:
        future = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    except BaseException:
        _bucket_end(mark, queued=False)
        raise

    def done(result):
        _bucket_end(mark)
        return result.value()[0]

    return future.then(done)


def _first_tensor(result):
    return result.value()[0]


def patch_ddp(module):
    """Time DDP's gradient all-reduce (module ``torch.nn.parallel.distributed``)."""
    import functools

    ddp = getattr(module, "DistributedDataParallel", None)
    if ddp is None or getattr(ddp, "_launcher_timed", False):
        return
    register = ddp.register_comm_hook
    register_builtin = ddp._register_builtin_comm_hook
    forward = ddp.forward

    @functools.wraps(register)
    def register_comm_hook(self, state, hook):
        self._launcher_hooked = True
        return register(self, state, _timed_hook(hook))

    @functools.wraps(register_builtin)
    def register_builtin_comm_hook(self, comm_hook_type):
        self._launcher_hooked = True  # runs in C++: not timed (docs/stragglers.md)
        return register_builtin(self, comm_hook_type)

    @functools.wraps(forward)
    def timed_forward(self, *args, **kwargs):
        if not self.__dict__.get("_launcher_hooked"):
            self._launcher_hooked = True
            if not self._comm_hooks and (_state if _state is not None else _open()):
                register(self, self.process_group, _mean_allreduce_hook)  # times its last bucket itself
        return forward(self, *args, **kwargs)

    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = register_builtin_comm_hook
    ddp.forward = timed_forward
    ddp._launcher_timed = True


def optimizer_stepped(optimizer, args, kwargs):
    """torch's global optimizer step post-hook: an optimizer step is this rank's progress
    (``--hang-timeout``): the time, and the count of steps so far, into the heartbeat slot; with
    collectives on the GPU, the events of those complete by now are read (never waited for)."""
    global _optimizer_steps
    beat = _heartbeat_slot()
    if not beat:
        return
    _optimizer_steps += 1
    page, offset = beat
    _OPTIMIZER.pack_into(page, offset + OPTIMIZER_STEPS_OFFSET, _optimizer_steps)
    _BEAT.pack_into(page, offset, _monotonic())
    timeline = _timeline
    if timeline:
        try:
            _publish_gpu(timeline)
        except Exception as exc:
            _give_up_gpu(exc)


def patch_optimizer(module):
    """Count optimizer steps as progress (module ``torch.optim.optimizer``): one global hook for
    every optimizer, those made before this call included."""
    if getattr(module, "_launcher_step_hook", None) is None:
        module._launcher_step_hook = module.register_optimizer_step_post_hook(optimizer_stepped)


def patch_dataloader(module):
    """Count each batch a ``DataLoader`` hands the main thread as progress (module
    ``torch.utils.data.dataloader``, ``--hang-timeout``): an evaluation pass takes no optimizer
    step, and may run no collective per batch (Lightning's validation loop reduces once, at its
    end), yet it is not a hang. A loader that blocks hands out nothing: a rank stuck in its data
    is still one. Batches taken by another thread (a prefetcher) are not the rank's progress."""
    cls = getattr(module, "_BaseDataLoaderIter", None)
    original = getattr(cls, "__next__", None)
    if cls is None or original is None or getattr(original, "_launcher_batch", False):
        return
    import functools
    import threading

    main = threading.main_thread().ident
    get_ident = threading.get_ident

    @functools.wraps(original)
    def next_batch(self):
        batch = original(self)
        if get_ident() == main:
            beat = _heartbeat_slot()
            if beat:
                try:  # noqa: SIM105 (per batch: a bare try costs less than a context manager)
                    _BEAT.pack_into(beat[0], beat[1], _monotonic())
                except (ValueError, TypeError, struct.error):  # unmapped under us: the batch goes on
                    pass
        return batch

    next_batch.__dict__["_launcher_batch"] = True
    cls.__next__ = next_batch


#: Where an automatic quiet section keeps, in the heartbeat slot, the longest checkpoint this
#: worker took (float64 seconds) and the checkpoints it finished (int64): the agent learns the
#: checkpoint timeout from them (``launcher.hangs.heartbeat``'s layout).
_CHECKPOINTS = struct.Struct("<dq")
CHECKPOINTS_OFFSET = 72
#: The name of the quiet section a checkpoint opens. Its deadline is written as infinity: the
#: agent judges it against the checkpoint timeout it holds (learned, or the fixed one).
CHECKPOINT_SECTION = b"checkpoint"
_longest_checkpoint = 0.0
_checkpoints = 0
#: Nesting of checkpoint calls on the main thread (DCP's save calls torch.save: counted once).
_checkpoint_depth = 0


def _checkpoint_section(function):
    """``function`` (``torch.save``, a ``torch.distributed.checkpoint`` save or load) as a quiet
    section named ``checkpoint`` of the rank (``--hang-timeout``): opened on the main thread
    only (a save in a background thread does not stop the rank's progress), once for nested
    calls, and not inside a quiet section the job opened itself (``launcher.quiet()``: its own
    timeout stands). Leaving it is a beat, and its length is kept for the agent to learn from.
    The call, its result and its exceptions are the function's own."""
    import functools
    import threading

    main_thread = threading.main_thread
    get_ident = threading.get_ident

    @functools.wraps(function)
    def checkpoint(*args, **kwargs):
        global _checkpoint_depth, _longest_checkpoint, _checkpoints
        if _checkpoint_depth or get_ident() != main_thread().ident:
            return function(*args, **kwargs)
        beat = _heartbeat_slot()
        if not beat:
            return function(*args, **kwargs)
        page, offset = beat
        _checkpoint_depth = 1
        opened = 0.0
        try:
            try:
                if not _EXIT_QUIET.unpack_from(page, offset + _EXIT_QUIET_OFFSET)[0]:  # no section open
                    opened = _monotonic()
                    _EXIT_QUIET.pack_into(page, offset + _EXIT_QUIET_OFFSET, float("inf"), opened,
                                          CHECKPOINT_SECTION)
            except (ValueError, TypeError, struct.error):  # unmapped under us: the call goes on
                opened = 0.0
            return function(*args, **kwargs)
        finally:
            _checkpoint_depth = 0
            if opened:
                now = _monotonic()
                _checkpoints += 1
                _longest_checkpoint = max(_longest_checkpoint, now - opened)
                try:
                    _CHECKPOINTS.pack_into(page, offset + CHECKPOINTS_OFFSET, _longest_checkpoint, _checkpoints)
                    _BEAT.pack_into(page, offset, now)
                    _EXIT_QUIET.pack_into(page, offset + _EXIT_QUIET_OFFSET, 0.0, 0.0, b"")
                except (ValueError, TypeError, struct.error):
                    pass

    checkpoint.__dict__["_launcher_checkpoint"] = True
    return checkpoint


def _wrap_checkpoints(module, names, alias):
    """Make each function of ``module`` named in ``names`` a checkpoint section, in place (once);
    also in the module ``alias`` (the package that re-exports them), when it already bound the
    original (a preloaded worker, whose template imported torch before the hook was installed)."""
    exported = sys.modules.get(alias)
    for name in names:
        function = getattr(module, name, None)
        if callable(function) and not getattr(function, "_launcher_checkpoint", False):
            wrapped = _checkpoint_section(function)
            setattr(module, name, wrapped)
            if exported is not None and getattr(exported, name, None) is function:
                setattr(exported, name, wrapped)


def patch_torch_save(module):
    """``torch.save`` (module ``torch.serialization``, patched before ``torch`` binds its name)."""
    _wrap_checkpoints(module, ("save",), "torch")


def patch_dcp_save(module):
    """``torch.distributed.checkpoint``'s saves (module ``state_dict_saver``, patched before the
    package binds their names)."""
    _wrap_checkpoints(module, ("save", "async_save", "save_state_dict"), "torch.distributed.checkpoint")


def patch_dcp_load(module):
    """``torch.distributed.checkpoint``'s loads (module ``state_dict_loader``)."""
    _wrap_checkpoints(module, ("load", "load_state_dict"), "torch.distributed.checkpoint")


#: The module each patch waits for (its import by the worker's code): the optimizer's and the
#: checkpoints' only with ``--hang-timeout`` (see :func:`install`).
_TARGETS = {"torch.distributed": patch_collectives, "torch.nn.parallel.distributed": patch_ddp,
            "torch.optim.optimizer": patch_optimizer, "torch.serialization": patch_torch_save,
            "torch.distributed.checkpoint.state_dict_saver": patch_dcp_save,
            "torch.distributed.checkpoint.state_dict_loader": patch_dcp_load,
            "torch.utils.data.dataloader": patch_dataloader}
#: The targets of hang detection alone.
_HANG_TARGETS = ("torch.optim.optimizer", "torch.serialization", "torch.distributed.checkpoint.state_dict_saver",
                 "torch.distributed.checkpoint.state_dict_loader", "torch.utils.data.dataloader")


class _Finder:
    """Patches a target module right after it is first executed (the user's import of it)."""

    def find_spec(self, name, path=None, target=None):
        patch = _TARGETS.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _patched(name, module, patch)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_finder = _Finder()


def _patched(name, module, patch):
    try:
        patch(module)
    except Exception as exc:  # measuring must never break training
        sys.stderr.write("launcher: cannot time the collectives of " + name + ": " + str(exc) + "\n")
    _TARGETS.pop(name, None)
    if not _TARGETS and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def install() -> None:
    """Time this worker's collectives once its code imports them (``--straggler-detection``) and
    count them and its optimizer steps as progress (``--hang-timeout``); see the module docstring.
    Nothing is imported here: each patch waits for the worker's own import of its module.

    Does nothing outside launcher's straggler and hang detection; safe to call more than once.
    """
    timing = bool(os.environ.get(STRAGGLER_FILE_ENV))
    if not timing and not os.environ.get(HEARTBEAT_FILE_ENV):
        return
    if timing and not os.environ.get(STRAGGLER_PID_ENV):
        os.environ[STRAGGLER_PID_ENV] = str(os.getpid())
    if not os.environ.get(HEARTBEAT_FILE_ENV):
        for name in _HANG_TARGETS:  # steps and checkpoints matter to hang detection only
            _TARGETS.pop(name, None)
    for name, patch in list(_TARGETS.items()):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__spec__", None) is not None:
            _patched(name, module, patch)  # already imported (a preloaded template)
    if _TARGETS and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
