"""``--hang-timeout auto``: timeouts learned from the job's own progress (issue 46, part 2).

Pure parts (the flags, the watch's learning on a fake clock, the exchange between nodes, the
status and metrics views) first; then real workers, real gloo, real torch: a plain DDP job with no
launcher call.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import re
import struct

import pytest
from launcher.errors import UsageError
from launcher.hangs import cluster
from launcher.hangs.settings import DEFAULT_FACTOR, DEFAULT_FLOOR, DEFAULT_START_TIMEOUT, hang_settings
from launcher.hangs.watch import AUTO_WARMUP, AUTO_WINDOW, HangWatch, HeartbeatTable, LearnedTimeouts
from launcher.status import metrics, render

from tests.background_job import BackgroundJob
from tests.conftest import run_launcher

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (gloo)")


# -- the flags -------------------------------------------------------------------------------------

def test_auto_takes_the_defaults_and_numbers_stay_fixed():
    auto = hang_settings("auto")
    assert auto.auto and auto.enabled
    assert (auto.timeout, auto.factor, auto.floor) == (DEFAULT_START_TIMEOUT, DEFAULT_FACTOR, DEFAULT_FLOOR)
    tuned = hang_settings(" AUTO ", factor="3", start_timeout="120", floor="2.5")
    assert (tuned.timeout, tuned.factor, tuned.floor) == (120.0, 3.0, 2.5)
    fixed = hang_settings("300")
    assert fixed.timeout == 300.0 and not fixed.auto
    assert not hang_settings(None).enabled


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"timeout": "300", "factor": "3"}, "--hang-factor only applies to learned timeouts: give --hang-timeout auto"),
    ({"timeout": None, "floor": "3"}, "--hang-floor only applies to learned timeouts"),
    ({"timeout": "soon"}, "--hang-timeout 'soon' is invalid: give seconds (e.g. 300) or auto"),
    ({"timeout": "auto", "factor": "0.5"}, "--hang-factor '0.5' is invalid: give a number from 1 to 1000"),
    ({"timeout": "auto", "factor": "nan"}, "--hang-factor 'nan' is invalid"),
    ({"timeout": "auto", "start_timeout": "0"}, "--hang-start-timeout must be a number of seconds above 0"),
    ({"timeout": "auto", "floor": "-1"}, "--hang-floor must be a number of seconds above 0"),
])
def test_bad_values_say_what_is_wrong(kwargs, message):
    with pytest.raises(UsageError) as caught:
        hang_settings(**kwargs)
    assert message in str(caught.value)


def test_the_api_takes_auto_too():
    from launcher.config import LaunchConfig

    config = LaunchConfig(nproc_per_node=1, hang_timeout="auto", hang_floor=2)
    assert config.hangs.auto and config.hangs.floor == 2.0 and config.hang_timeout == "auto"
    assert LaunchConfig.from_settings(config.to_settings()).hangs == config.hangs
    with pytest.raises(UsageError):
        LaunchConfig(nproc_per_node=1, hang_timeout=30, hang_factor=3)


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--hang-timeout", "30", "--hang_factor", "3"], {},
     "launcher: error: --hang-factor only applies to learned timeouts: give --hang-timeout auto with it, "
     "or leave it out"),
    (["--hang-timeout", "auto"], {"PET_HANG_FLOOR": "zero"}, "PET_HANG_FLOOR must be a number of seconds"),
    (["--hang-timeout", "later"], {}, "--hang-timeout 'later' is invalid: give seconds (e.g. 300) or auto"),
])
def test_bad_input_on_the_command_line_is_one_line_and_starts_nothing(args, env, message, write_script, tmp_path):
    marker = tmp_path / "started"
    script = write_script("touch.py", f"open({str(marker)!r}, 'w').close()\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "1", *args, script], env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) <= 2, result.stderr
    assert not marker.exists()


# -- the watch, on a fake clock --------------------------------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _beat(path: str, index: int, when: float) -> None:
    from launcher.hangs.heartbeat import SLOT_SIZE

    with open(path, "r+b") as handle, mmap.mmap(handle.fileno(), 0) as page:
        struct.pack_into("<d", page, index * SLOT_SIZE, when)


def test_the_watch_learns_from_the_beats_it_sees_and_judges_each_phase(tmp_path, caplog):
    clock = _Clock()
    table = HeartbeatTable(str(tmp_path / "beats"), 2)
    learned = LearnedTimeouts(30.0, factor=5.0, floor=2.0)
    watch = HangWatch(table, 30.0, clock=clock, learned=learned)
    try:
        watch.started(0)
        watch.started(1)
        clock.now += 29  # the start phase: no progress yet, within the start timeout
        assert not watch.hung()
        clock.now += 2
        (state,) = [s for s in watch.progress() if s.local_rank == 0][:1]
        assert state.hung and "no heartbeat yet after 31.0 s (start timeout 30 s)" in state.reason
        # Both ranks beat every 0.5 s (rank 1 every 1 s: the maximum over ranks wins); a status
        # read (learn=False) teaches nothing.
        with caplog.at_level("INFO", logger="launcher.hangs"):
            for tick in range(2 * (AUTO_WARMUP + AUTO_WINDOW) + 2):
                clock.now += 0.5
                _beat(table.path, 0, clock.now)
                if tick % 2:
                    _beat(table.path, 1, clock.now)
                watch.progress()
                watch.progress(learn=True)
        assert learned.steady == 5.0, learned.steady  # 5 x rank 1's 1 s interval
        assert "hang timeout (steady) learned: 5 s (5 x the longest interval, 1 s, over" in caplog.text
        clock.now += 4.9
        assert not watch.hung()
        clock.now += 0.3
        hung = watch.hung()
        assert [s.local_rank for s in hung] == [0, 1] or [s.local_rank for s in hung] == [0]
        assert "(learned timeout 5 s)" in hung[0].reason
        assert learned.as_dict() == {"start": 30.0, "steady": 5.0, "checkpoint": None}
    finally:
        table.close()


def test_a_sampled_span_counts_its_steps():
    from launcher.hangs.learning import IntervalLearner, LearningRule

    learner = IntervalLearner(LearningRule(factor=5, floor=1, warmup=10, window=50))
    assert learner.observe(0.3, 8) is None  # all warm-up
    assert learner.observe(0.4, 30) is None  # 2 of them warm-up, 28 in the window
    assert learner.observe(0.5, 22) == 2.5  # 50 in the window: 5 x the longest
    assert learner.seen == 60 and learner.last_longest == 0.5


def test_a_learned_value_only_grows_and_the_floor_holds(caplog):
    learned = LearnedTimeouts(600.0, factor=5.0, floor=60.0)
    with caplog.at_level("INFO", logger="launcher.hangs"):
        assert learned.offer(60.0, longest=0.2, intervals=25)
        assert not learned.offer(50.0, source="the largest of the nodes'")
        assert learned.offer(90.0, source="the largest of the nodes'")
    assert learned.steady == 90.0
    assert caplog.text.count("hang timeout (steady) learned:") == 2
    assert "learned: 60 s (the floor, --hang-floor" in caplog.text


# -- between nodes ---------------------------------------------------------------------------------

class _Store:
    """compare_set, as launcher's KeyValueStore documents it; counts the requests."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.requests = 0

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        self.requests += 1
        current = self.data.get(key)
        if current is None:
            if expected:
                return expected
            self.data[key] = desired
            return desired
        if current == expected:
            self.data[key] = desired
            return desired
        return current


def test_nodes_share_the_largest_learned_value_in_o1_requests():
    store = _Store()
    key = cluster.learned_key("job")
    assert cluster.share_learned(store, key, {"steady": None}) == {} and store.requests == 1
    assert cluster.share_learned(store, key, {"steady": 12.0}) == {"steady": 12.0}
    assert cluster.share_learned(store, key, {"steady": 8.0}) == {"steady": 12.0}  # a smaller value takes the larger
    # Each phase is the largest of its own.
    assert cluster.share_learned(store, key, {"steady": 30.0, "checkpoint": 60.0}) == {"steady": 30.0,
                                                                                      "checkpoint": 60.0}
    assert cluster.share_learned(store, key, {"steady": 40.0, "checkpoint": None}) == {"steady": 40.0,
                                                                                      "checkpoint": 60.0}
    store.requests = 0
    for _ in range(100):  # nothing new: one request each time, whatever the number of nodes
        assert cluster.share_learned(store, key, {"steady": 40.0, "checkpoint": 50.0})["steady"] == 40.0
    assert store.requests == 100


def test_each_node_takes_the_largest_value_through_the_store(caplog):
    from types import SimpleNamespace

    from launcher.hangs.monitor import HangMonitor

    store = _Store()
    monitors = [HangMonitor(600.0, node=f"n{i}", run_id="job", learned=LearnedTimeouts(600.0, factor=5, floor=8))
                for i in range(3)]
    try:
        for monitor in monitors:
            monitor._info = SimpleNamespace(store=store, group_world_size=3)
        monitors[1].learned.offer(20.0)
        monitors[2].learned.offer(90.0, phase="checkpoint", longest=18.0)
        with caplog.at_level("INFO", logger="launcher.hangs"):
            for monitor in [*monitors, *monitors]:
                monitor._share_learned()
        assert [m.hang_timeouts() for m in monitors] == [{"start": 600.0, "steady": 20.0, "checkpoint": 90.0}] * 3
        assert caplog.text.count("(steady) learned: 20 s (the largest of the nodes')") == 2
        assert caplog.text.count("(checkpoint) learned: 90 s (the largest of the nodes')") == 2
    finally:
        for monitor in monitors:
            monitor.close()


# -- status and /metrics ---------------------------------------------------------------------------

def test_status_and_metrics_show_the_timeouts():
    doc = {"run_id": "j", "node": "n", "updated_at": 0.0, "restarts_used": 0, "restarts_left": 0,
           "max_restarts": 0, "round": 0, "ranks": [], "hang_timeouts": {"start": 600.0, "steady": 42.0}}
    text = metrics.render(doc, 0, now=0.0)
    assert 'launcher_hang_timeout_seconds{job="j",node="n",phase="start"} 600' in text
    assert 'launcher_hang_timeout_seconds{job="j",node="n",phase="steady"} 42' in text
    doc["hang_timeouts"] = {"start": 600.0, "steady": None}
    assert 'phase="steady"' not in metrics.render(doc, 0, now=0.0)
    status = {"job": {"run_id": "j", "nodes": 1, "world_size": 0, "round": 0, "restarts_used": 0,
                      "restarts_left": 0, "elapsed_s": 1.0, "hung_ranks": [], "failed_ranks": [],
                      "hang_timeouts": {"start": 600.0, "steady": None}},
              "nodes": [], "missing_nodes": [], "store_problem": None, "ranks": []}
    assert "hang timeouts: start 600 s, steady not learned yet" in render.render(status)


# -- real jobs -------------------------------------------------------------------------------------

# A plain DDP loop over gloo, no launcher call. Arguments: a directory of control files. Each rank
# writes ready.<attempt>.<rank> after its first step. In attempt 0 the ranks fail once "fail" exists;
# in attempt 1 the rank named in "block" blocks in its data loading at its step 3. Every "every"
# steps a torch.save that takes "save_s" seconds (its file writes slowly); the first step's data
# take "slow_first" seconds; the loop ends once "go" exists or after "steps" steps.
DDP = """
import io, os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

control = sys.argv[1]
every, save_s, slow_first, steps = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def path(name):
    return os.path.join(control, name)

def load_batch(step):
    if step == 0:
        time.sleep(slow_first)
    if attempt == 1 and step == 3 and os.path.exists(path("block")):
        if int(open(path("block")).read()) == rank:
            while True:  # a data loader reading from a dead mount
                time.sleep(1)
    return torch.randn(4, 8)

class SlowFile(io.BytesIO):
    def write(self, data):
        if not self.tell():  # a slow disk: the save takes save_s seconds
            time.sleep(save_s)
        return super().write(data)

for step in range(steps):
    if os.path.exists(path("go")):
        break
    if attempt == 0 and os.path.exists(path("fail")):
        os._exit(3)  # at once: an exit through the interpreter's teardown may wait on gloo peers
    loss = model(load_batch(step)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if every and step % every == every - 1:
        torch.save(model.state_dict(), SlowFile())
    if step == 0:
        with open(path(f"ready.{attempt}.{rank}"), "w") as handle:
            handle.write(str(os.getpid()))
    time.sleep(0.02)
dist.destroy_process_group()
"""

# A floor well above what a busy CI machine stalls a step for (seconds, at times), well below the
# start timeout: a detection with the learned value cannot be one with the start timeout.
AUTO = ["--hang-timeout", "auto", "--hang-start-timeout", "60", "--hang-floor", "8", "--hang-factor", "5"]


def _learned(job: BackgroundJob):
    from tests.status.jobs import status

    result = status(str(job.process.pid), "--json")
    if result.returncode != 0:
        return None
    timeouts = json.loads(result.stdout)["job"].get("hang_timeouts") or {}
    return timeouts if timeouts.get("steady") else None


@needs_torch
@pytest.mark.timeout(240)
def test_learned_values_survive_a_restart_and_name_the_blocked_rank(write_script, tmp_path):
    from tests.status.jobs import wait_for

    script = write_script("ddp.py", DDP)
    job = BackgroundJob(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *AUTO, script,
                         str(tmp_path), "0", "0", "0", "100000"], tmp_path / "go")
    try:
        job.wait_for_ranks([tmp_path / "ready.0.0", tmp_path / "ready.0.1"], "attempt 0", timeout=120)
        timeouts = wait_for(lambda: _learned(job), "a learned steady timeout in launcher status", timeout=120)
        assert timeouts["start"] == 60.0 and timeouts["steady"] >= 8.0, timeouts  # never below the floor
        (tmp_path / "block").write_text("1")
        (tmp_path / "fail").touch()  # attempt 0 fails; attempt 1 blocks rank 1 at its step 3
        _, stderr = job.process.communicate(timeout=150)  # the hang ends the job: no restarts left
        code = job.process.returncode
    finally:
        if job.process.poll() is None:
            job.finish()
    assert code == 1, stderr
    assert re.search(r"^\[launcher\] INFO: hang timeout \(steady\) learned: [\d.]+ s \(", stderr, re.M), stderr
    assert "worker group failed" in stderr or "restarting" in stderr, stderr
    # The restarted attempt judged with the value learned before, from its first steps (still
    # warm-up for a new learner): not with the 60 s start timeout.
    found = re.search(r"^launcher: hang detected by \S+: rank 1 \(local rank 1\): no heartbeat for [\d.]+ s "
                      r"\(learned timeout ([\d.]+) s\)", stderr, re.M)
    assert found, stderr
    assert float(found.group(1)) >= timeouts["steady"] * 0.95, stderr
    assert stderr.count("hang detected") == 1, stderr  # attempt 0 failed; it did not hang
    assert re.search(r"^  rank 1: load_batch \(ddp\.py:\d+\) <- <module> \(ddp\.py:\d+\)$", stderr, re.M), stderr


@needs_torch
@pytest.mark.timeout(240)
def test_a_slow_start_and_slow_checkpoints_raise_no_false_alarm(write_script, tmp_path):
    # The first step's data take 9 s, more than the floor (judged against the start timeout:
    # nothing is learned yet); a 2.5 s torch.save every 20 steps is a quiet section of its own
    # (the checkpoint timeout is learned from it), not an interval of the steps (so few are left
    # to learn a steady timeout from in 100 steps). The job ends by itself.
    script = write_script("ddp.py", DDP)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", *AUTO, script, str(tmp_path), "20", "2.5", "9",
                           "100"], timeout=200)
    assert result.returncode == 0, result.stderr
    assert "hang detected" not in result.stderr, result.stderr
    learned = re.findall(r"hang timeout \(checkpoint\) learned: ([\d.]+) s \(5 x the longest checkpoint",
                         result.stderr)
    assert learned and float(learned[-1]) >= 12.5, result.stderr  # 5 x the checkpoint's 2.5 s at least
