"""Checkpoints as automatic quiet sections (issue 46, part 2), and ranks waiting for a peer's
quiet section.

The worker's side first: the start-up hook's wrapping of ``torch.save`` and
``torch.distributed.checkpoint`` (loaded as the hook loads it, in a fresh interpreter with a real
heartbeat slot); then the watch on a fake clock (the checkpoint timeout, learned or fixed; a rank
waiting for another rank's section, on this node or another); then real jobs: a plain DDP job over
gloo, no launcher call, whose rank 0 checkpoints for longer than the learned step timeout while
rank 1 waits in the next all-reduce.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launcher.hangs.heartbeat import _QUIET, _QUIET_OFFSET, CHECKPOINTS_OFFSET, SLOT_SIZE
from launcher.hangs.watch import HangWatch, HeartbeatTable, LearnedTimeouts

from tests.conftest import launcher_env, run_launcher
from tests.hangs.hook import LOAD_HOOK, TIMING

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")

# -- the wrapping, in a worker-like interpreter ----------------------------------------------------

# Loads the hook as the start-up hook does, then checks what each case asks, printing one JSON
# object. The slot is read from inside the checkpoint (a file-like object's write) to see the
# section while it is open.
_HOOK = LOAD_HOOK + r"""
import inspect, io, json, os, struct, sys, tempfile, threading
import mmap
handle = open(os.environ["LAUNCHER_HEARTBEAT_FILE"], "r+b")
page = mmap.mmap(handle.fileno(), 0)
SLOT = 128 * int(os.environ["LAUNCHER_HEARTBEAT_SLOT"])

def section():
    deadline, started, name = struct.unpack_from("<dd40s", page, SLOT + 8)
    return [deadline if deadline != float("inf") else "inf", name.rstrip(b"\0").decode()]

def checkpoints():
    return list(struct.unpack_from("<dq", page, SLOT + 72))

class Watched(io.BytesIO):
    seen = []
    def write(self, data):
        Watched.seen.append(section())
        return super().write(data)

class Broken(io.BytesIO):
    def write(self, data):
        raise KeyError("disk full")

import torch
out = {"wrapped": bool(getattr(torch.save, "_launcher_checkpoint", False)),
       "same": torch.save is torch.serialization.save,
       "signature": str(inspect.signature(torch.save)) == str(inspect.signature(torch.save.__wrapped__)),
       "doc": torch.save.__doc__ == torch.save.__wrapped__.__doc__ and torch.save.__name__ == "save"}
case = sys.argv[1]
if case == "save":
    torch.save({"w": torch.zeros(3)}, Watched())
    out["inside"] = Watched.seen[0]
    out["after"] = section()
    out["checkpoints"] = checkpoints()
    out["beat"] = struct.unpack_from("<d", page, SLOT)[0] > 0
    before = torch.save
    timing.patch_torch_save(torch.serialization)
    timing.install()
    out["idempotent"] = torch.save is before and torch.save.__wrapped__.__module__ == "torch.serialization"
    error = None
    try:
        torch.save({"w": 1}, Broken())
    except KeyError as exc:
        error = str(exc)
    out["error"] = error
    out["after_error"] = [section(), checkpoints()[1]]
    # In a thread: the rank's main thread goes on making progress, no section.
    Watched.seen = []
    thread = threading.Thread(target=torch.save, args=({"w": 1}, Watched()))
    thread.start(); thread.join()
    out["thread"] = Watched.seen[0]
    # Inside a section the job opened itself: its own timeout stands.
    struct.pack_into("<dd40s", page, SLOT + 8, 12345.0, 1.0, b"eval")
    Watched.seen = []
    torch.save({"w": 1}, Watched())
    out["in_own_section"] = [Watched.seen[0], section(), checkpoints()[1]]
    struct.pack_into("<dd40s", page, SLOT + 8, 0.0, 0.0, b"")
if case == "dcp":
    import torch.distributed.checkpoint as dcp
    out["dcp_wrapped"] = all(getattr(getattr(dcp, name), "_launcher_checkpoint", False)
                             for name in ("save", "load", "async_save", "save_state_dict", "load_state_dict"))
    out["dcp_signature"] = str(inspect.signature(dcp.save)) == str(inspect.signature(dcp.save.__wrapped__))
    inner = []
    real = torch.serialization.save.__wrapped__
    # Count what runs inside: DCP's own torch.save calls are nested, not sections of their own.
    import torch.distributed.checkpoint.filesystem as fs
    original = fs.FileSystemWriter.write_data
    def write_data(self, plan, planner):
        inner.append(section())
        torch.save({"x": 1}, io.BytesIO())  # a torch.save nested in the DCP save
        inner.append(section())
        return original(self, plan, planner)
    fs.FileSystemWriter.write_data = write_data
    folder = tempfile.mkdtemp()
    dcp.save({"w": torch.zeros(4)}, checkpoint_id=folder, no_dist=True)
    out["inner"] = inner
    out["after_save"] = [section(), checkpoints()[1]]
    state = {"w": torch.ones(4)}
    dcp.load(state, checkpoint_id=folder, no_dist=True)
    out["loaded"] = state["w"].tolist()
    out["after_load"] = [section(), checkpoints()[1]]
    del real
print(json.dumps(out))
"""


def _run_hook(tmp_path: Path, case: str, **extra: str) -> dict:
    table = HeartbeatTable(str(tmp_path / "beats"), 2)
    env = launcher_env({"LAUNCHER_HEARTBEAT_FILE": table.path, "LAUNCHER_HEARTBEAT_SLOT": "1",
                        "TIMING": str(TIMING), **extra})
    try:
        result = subprocess.run([sys.executable, "-c", _HOOK, case], env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.splitlines()[-1])
    finally:
        table.close()


@needs_torch
def test_torch_save_is_one_checkpoint_section_with_the_functions_own_face(tmp_path):
    out = _run_hook(tmp_path, "save")
    assert out["wrapped"] and out["same"] and out["signature"] and out["doc"], out
    assert out["inside"] == ["inf", "checkpoint"], out  # the agent's timeout applies (infinite deadline)
    assert out["after"] == [0.0, ""] and out["beat"], out  # closed; leaving it is a beat
    longest, count = out["checkpoints"]
    assert count == 1 and 0 < longest < 60, out
    assert out["idempotent"], out
    # An exception passes unchanged, and the section is closed behind it.
    assert out["error"] == "'disk full'" and out["after_error"] == [[0.0, ""], 2], out
    assert out["thread"] == [0.0, ""], out  # a save in another thread opens none
    assert out["in_own_section"] == [[12345.0, "eval"], [12345.0, "eval"], 2], out


@needs_torch
def test_dcp_save_and_load_are_sections_and_nested_saves_count_once(tmp_path):
    out = _run_hook(tmp_path, "dcp")
    assert out["dcp_wrapped"] and out["dcp_signature"], out
    assert out["inner"] == [["inf", "checkpoint"]] * 2, out  # the nested torch.save left the section open
    assert out["after_save"] == [[0.0, ""], 1], out  # one checkpoint, not two
    assert out["loaded"] == [0.0] * 4 and out["after_load"] == [[0.0, ""], 2], out


@needs_torch
def test_a_worker_that_imported_torch_before_the_hook_is_wrapped_too(tmp_path):
    # A preloaded worker: its template imported torch (and DCP) before the hook was installed.
    table = HeartbeatTable(str(tmp_path / "beats"), 1)
    code = ("import torch, torch.distributed.checkpoint as dcp\n" + LOAD_HOOK +
            "print(torch.save is torch.serialization.save, hasattr(torch.save, '_launcher_checkpoint'),\n"
            "      all(hasattr(getattr(dcp, n), '_launcher_checkpoint') for n in ('save', 'load', 'async_save')))\n")
    env = launcher_env({"LAUNCHER_HEARTBEAT_FILE": table.path, "LAUNCHER_HEARTBEAT_SLOT": "0",
                        "TIMING": str(TIMING)})
    try:
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    finally:
        table.close()
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"], result.stdout


@needs_torch
def test_nothing_is_wrapped_without_hang_detection(tmp_path):
    # --straggler-detection alone loads the same hook: checkpoints are no business of its own.
    straggler = tmp_path / "timing"
    straggler.write_bytes(b"\0" * 128)
    code = (LOAD_HOOK +
            "import torch, torch.distributed.checkpoint as dcp\n"
            "print(hasattr(torch.save, '__wrapped__'), hasattr(dcp.save, '_launcher_checkpoint'))\n")
    env = launcher_env({"LAUNCHER_STRAGGLER_FILE": str(straggler), "LAUNCHER_STRAGGLER_SLOT": "0",
                        "TIMING": str(TIMING)})
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"], result.stdout


# -- the watch, on a fake clock --------------------------------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Slots:
    """The heartbeat file, written as the workers write it."""

    def __init__(self, path: Path, count: int) -> None:
        self.table = HeartbeatTable(str(path), count)
        self._handle = open(path, "r+b")  # noqa: SIM115 - closed in close()
        self.page = mmap.mmap(self._handle.fileno(), 0)

    def beat(self, index: int, when: float) -> None:
        struct.pack_into("<d", self.page, index * SLOT_SIZE, when)

    def section(self, index: int, started: float, name: bytes = b"checkpoint",
                deadline: float = float("inf")) -> None:
        _QUIET.pack_into(self.page, index * SLOT_SIZE + _QUIET_OFFSET, deadline, started, name)

    def end(self, index: int, when: float, longest: float, count: int) -> None:
        struct.pack_into("<dq", self.page, index * SLOT_SIZE + CHECKPOINTS_OFFSET, longest, count)
        self.beat(index, when)
        _QUIET.pack_into(self.page, index * SLOT_SIZE + _QUIET_OFFSET, 0.0, 0.0, b"")

    def close(self) -> None:
        self.page.close()
        self._handle.close()
        self.table.close()


@pytest.fixture
def slots(tmp_path):
    made = _Slots(tmp_path / "beats", 2)
    yield made
    made.close()


def test_a_checkpoint_is_judged_by_the_checkpoint_timeout_learned_from_its_length(slots, caplog):
    clock = _Clock()
    learned = LearnedTimeouts(30.0, factor=5.0, floor=2.0)
    learned.offer(4.0)  # a steady timeout learned from the steps
    watch = HangWatch(slots.table, 30.0, clock=clock, learned=learned)
    slots.beat(0, 1000.0)
    slots.beat(1, 1000.0)
    slots.section(0, 1000.0)  # rank 0 saves; rank 1 waits for it in the next all-reduce
    for _ in range(25):  # 25 s: past the steady timeout, within the start timeout (none learned yet)
        clock.now += 1.0
        assert not any(state.hung for state in watch.progress(learn=True))
        assert not watch.hung()  # a status read between two checks sees the same
    with caplog.at_level("INFO", logger="launcher.hangs"):
        slots.end(0, 1025.0, 25.0, 1)
        clock.now += 0.5
        watch.progress(learn=True)
    assert learned.checkpoint == 125.0 and learned.checkpoint_timeout() == 125.0
    assert "hang timeout (checkpoint) learned: 125 s (5 x the longest checkpoint, 25 s)" in caplog.text
    assert learned.as_dict() == {"start": 30.0, "steady": 4.0, "checkpoint": 125.0}
    # Rank 1's silence counts from rank 0's section's end; the wait was not learned as a step.
    clock.now = 1025.0 + 3.9
    assert not watch.hung()
    assert learned.steady == 4.0
    slots.beat(0, 1028.0)  # rank 0 goes on to its next step, and waits for rank 1
    clock.now = 1025.0 + 4.2
    (state,) = watch.hung()
    assert state.local_rank == 1 and state.reason == (
        "no heartbeat for 29.2 s, 25.0 s of it waiting while another rank was in a quiet section "
        "(learned timeout 4 s)"), state.reason
    # A checkpoint past its learned timeout is a hang, named so.
    slots.beat(1, clock.now)
    slots.section(0, clock.now)
    clock.now += 126.0
    rank0 = watch.progress()[0]
    assert rank0.hung and rank0.quiet == "checkpoint"
    assert rank0.reason == "in quiet section 'checkpoint' for 126.0 s, past its timeout of 125 s", rank0.reason


def test_with_a_fixed_timeout_a_checkpoint_has_that_timeout_and_peers_wait_for_it(slots):
    clock = _Clock()
    watch = HangWatch(slots.table, 10.0, clock=clock)
    slots.beat(0, 1000.0)
    slots.beat(1, 1000.0)
    slots.section(0, 1000.0)
    for _ in range(10):
        clock.now += 1.0
        assert not any(state.hung for state in watch.progress(learn=True))
    clock.now = 1010.5
    assert [(s.local_rank, s.quiet) for s in watch.progress(learn=True) if s.hung] == [(0, "checkpoint")]


def test_the_exiting_section_and_an_expired_one_excuse_nobody(slots):
    clock = _Clock()
    watch = HangWatch(slots.table, 5.0, clock=clock)
    slots.beat(0, 1000.0)
    slots.beat(1, 1000.0)
    slots.section(0, 1000.0, b"exiting", deadline=1120.0)  # rank 0's code is over: rank 1 waits for nothing
    clock.now = 1006.0
    assert [s.local_rank for s in watch.hung()] == [1]


def test_a_rank_waiting_for_a_quiet_section_on_another_node_is_not_hung(tmp_path):
    from types import SimpleNamespace

    from launcher.hangs.monitor import HangMonitor

    class Store:
        def __init__(self) -> None:
            self.data: dict[str, bytes] = {}
            self.requests = 0

        def set(self, key: str, value: bytes) -> None:
            self.requests += 1
            self.data[key] = value

        def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
            self.requests += 1
            current = self.data.get(key)
            if current is None:
                return expected if expected else self.data.setdefault(key, desired)
            if current == expected:
                self.data[key] = desired
            return self.data[key]

    store = Store()
    monitors, tables = [], []
    for node in range(2):
        learned = LearnedTimeouts(600.0, factor=5.0, floor=2.0)
        learned.offer(3.0)  # steps: 3 s; a checkpoint: the 600 s start timeout, none seen yet
        monitor = HangMonitor(600.0, node=f"n{node}", run_id="job", learned=learned)
        monitor._info = SimpleNamespace(store=store, group_world_size=2, round=0)
        monitor.prepare({0: {}})
        tables.append(_Slots(Path(monitor._watch.table.path), 1))
        monitors.append(monitor)
    try:
        now = time.monotonic()
        tables[0].beat(0, now)
        tables[1].beat(0, now)
        tables[0].section(0, now)  # node 0's rank saves; node 1's rank waits in the all-reduce
        for tick in range(1, 9):
            at = now + tick
            states = [monitor._watch.progress(at, learn=True) for monitor in monitors]
            monitors[0]._tell_quiet(at)
            assert not any(s.hung for group in states for s in group), (tick, states)
        # Node 0 wrote once a second (8); node 1 read only when its rank would have been hung
        # otherwise (from 4 s on), once a second at most.
        reads = store.requests - 8
        assert 1 <= reads <= 5, store.requests
        tables[0].end(0, now + 8.2, 8.2, 1)
        monitors[0]._watch.progress(now + 8.5, learn=True)
        monitors[0]._tell_quiet(now + 8.5)  # the end, once
        monitors[0]._tell_quiet(now + 9.5)
        assert store.requests == 8 + reads + 1, store.requests
        assert not monitors[1]._watch.progress(now + 10.5, learn=True)[0].hung
        late = monitors[1]._watch.progress(now + 11.5, learn=True)[0]
        assert late.hung and late.reason == ("no heartbeat for 11.5 s, 8.0 s of it waiting while another rank was "
                                             "in a quiet section (learned timeout 3 s)"), late.reason
    finally:
        for table in tables:
            table.close()
        for monitor in monitors:
            monitor.close()


def test_the_checkpoint_timeout_is_kept_across_attempts_and_shown(tmp_path):
    from launcher.hangs.monitor import HangMonitor
    from launcher.status import metrics, render

    learned = LearnedTimeouts(600.0, factor=5.0, floor=2.0)
    monitor = HangMonitor(600.0, node="n", run_id="job", learned=learned)
    try:
        monitor.prepare({0: {}, 1: {}})
        learned.offer(40.0, longest=8.0, phase="checkpoint")
        monitor.prepare({0: {}, 1: {}})  # a restart: a new table, the same learned values
        watch = monitor._watch
        assert watch is not None and watch.section_timeout("checkpoint") == 40.0
        timeouts = monitor.hang_timeouts()
        assert timeouts == {"start": 600.0, "steady": None, "checkpoint": 40.0}
    finally:
        monitor.close()
    doc = {"run_id": "j", "node": "n", "updated_at": 0.0, "restarts_used": 0, "restarts_left": 0,
           "max_restarts": 0, "round": 0, "ranks": [], "hang_timeouts": timeouts}
    text = metrics.render(doc, 0, now=0.0)
    assert 'launcher_hang_timeout_seconds{job="j",node="n",phase="checkpoint"} 40' in text
    assert 'phase="steady"' not in text  # none learned yet: no number
    status = {"job": {"run_id": "j", "nodes": 1, "world_size": 0, "round": 0, "restarts_used": 0,
                      "restarts_left": 0, "elapsed_s": 1.0, "hung_ranks": [], "failed_ranks": [],
                      "hang_timeouts": timeouts},
              "nodes": [], "missing_nodes": [], "store_problem": None, "ranks": []}
    assert "hang timeouts: start 600 s, steady not learned yet, checkpoint 40 s" in render.render(status)


# -- real jobs -------------------------------------------------------------------------------------

# A plain DDP loop over gloo, no launcher call. Arguments: steps; rank 0's checkpoints, as
# "step:seconds,step:seconds" (how long each takes: its file-like object's first write sleeps;
# "hang": it never returns); how: "save" (torch.save) or "dcp" (torch.distributed.checkpoint.save
# into a folder whose writer sleeps as it starts).
DDP = r"""
import io, os, sys, tempfile, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

steps, how = int(sys.argv[1]), sys.argv[3]
plan = {int(step): float(seconds.replace("hang", "3600")) for step, seconds in
        (item.split(":") for item in sys.argv[2].split(","))}
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

class SlowFile(io.BytesIO):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def write(self, data):
        if not self.tell():  # a slow disk: the save takes that long
            time.sleep(self.seconds)
        return super().write(data)

def checkpoint(seconds):
    if how == "dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        class SlowWriter(FileSystemWriter):
            def write_data(self, plan, planner):
                time.sleep(seconds)
                return super().write_data(plan, planner)

        folder = tempfile.mkdtemp()
        # Rank 0 alone, as a job saving its replicated state from rank 0 does.
        dcp.save(model.state_dict(), storage_writer=SlowWriter(folder), no_dist=True)
    else:
        torch.save(model.state_dict(), SlowFile(seconds))
    print(f"rank {rank}: checkpoint of {seconds} s written", flush=True)

for step in range(steps):
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()  # rank 1 waits here (DDP's all-reduce) while rank 0 checkpoints
    opt.step()
    if step in plan and rank == 0:
        checkpoint(plan[step])
    time.sleep(0.05)
dist.destroy_process_group()
print(f"rank {rank}: done", flush=True)
"""

# Small timeouts: a steady timeout is learned (the floor, 3 s) within the first 60 steps; the
# 600 s start timeout would never fire in these tests.
AUTO = ["--hang-timeout", "auto", "--hang-start-timeout", "600", "--hang-floor", "3", "--hang-factor", "5"]


def _job(write_script, args, script_args, timeout=90):
    script = write_script("ddp.py", DDP)
    started = time.monotonic()
    result = run_launcher(["--standalone", "--nproc-per-node", "2", *args, script, *script_args], timeout=timeout)
    return result, time.monotonic() - started


@needs_torch
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["save", "dcp"])
def test_rank_1_waiting_for_rank_0s_long_checkpoint_is_no_false_alarm(write_script, how):
    # Rank 0 checkpoints for 6 s at step 80, twice the learned steady timeout (3 s, the floor: the
    # steps take 0.05 s, learned from step 60 or so); rank 1 waits in DDP's all-reduce meanwhile.
    # Then the checkpoint timeout is learned from it (5 x 6 s).
    result, _ = _job(write_script, AUTO, ["110", "80:6", how])
    assert result.returncode == 0, result.stderr
    assert "hang detected" not in result.stderr, result.stderr
    steady = re.search(r"^\[launcher\] INFO: hang timeout \(steady\) learned: 3 s \(the floor", result.stderr, re.M)
    found = re.search(r"hang timeout \(checkpoint\) learned: ([\d.]+) s \(5 x the longest checkpoint, ([\d.]+) s\)",
                      result.stderr)
    assert steady and found and float(found.group(2)) >= 6.0, result.stderr
    assert steady.start() < found.start(), result.stderr  # learned before the checkpoint
    assert "rank 0: checkpoint of 6.0 s written" in result.stdout, result.stdout


@needs_torch
@pytest.mark.timeout(120)
def test_with_a_fixed_timeout_too(write_script):
    # A fixed 4 s timeout; rank 0's checkpoint takes 3.5 s (within it, from the section's start),
    # rank 1 waits in the all-reduce for those 3.5 s and more: not hung.
    result, _ = _job(write_script, ["--hang-timeout", "4"], ["60", "20:3.5", "save"])
    assert result.returncode == 0, result.stderr
    assert "hang detected" not in result.stderr, result.stderr


@needs_torch
@pytest.mark.timeout(120)
def test_a_checkpoint_that_hangs_is_reported_naming_the_rank_and_checkpoint(write_script):
    # A first checkpoint of 0.2 s teaches the checkpoint timeout (the floor, 3 s); the second
    # never ends, and is named past that timeout (rank 1, waiting for it, is not).
    result, _ = _job(write_script, AUTO, ["1000", "10:0.2,70:hang", "save"])
    assert result.returncode == 1, result.stderr
    assert "hang timeout (checkpoint) learned: 3 s (the floor" in result.stderr, result.stderr
    assert re.search(r"^launcher: hang detected by \S+: rank 0 \(local rank 0\): in quiet section 'checkpoint' "
                     r"for [\d.]+ s, past its timeout of 3 s", result.stderr, re.M), result.stderr
    assert result.stderr.count("hang detected") == 1, result.stderr
