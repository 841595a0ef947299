"""Recovery in place does not wait for a process group's abort to finish.

NCCL's abort tears its communicator down after setting its abort flag (joining NCCL's own threads:
about a second on an H100, issue 38); gloo's returns at once. Here, on CPU, one gloo rank's
``ProcessGroup.abort`` is held back until the next call of the training function has finished its
first all-reduce: the recovery must get there with the old group's abort still in progress (before,
the worker waited for the abort, so the next call could not start until the hold ran out). The
interface is the one torch's ``_abort_process_group()`` calls; only the abort's duration is NCCL's.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_launcher

SCRIPT = """
import json, os, sys, threading, time
import torch, torch.distributed as dist
import launcher

out = sys.argv[1]
released = threading.Event()  # set by the next call, once its first all-reduce is done
aborts = []
real_abort = dist.ProcessGroup.abort

def held_abort(group):  # NCCL's ncclCommAbort: the flag at once, the teardown later
    aborts.append("started")
    released.wait(60)
    real_abort(group)
    aborts.append("finished")

dist.ProcessGroup.abort = held_abort
calls = []

def note(event, **fields):
    with open(out, "a") as handle:
        handle.write(json.dumps({"event": event, "t": time.monotonic(), **fields}) + "\\n")

@launcher.recoverable
def train():
    calls.append(os.getpid())
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(4))
    if len(calls) == 1:
        note("raising")
        raise RuntimeError("the first call fails")
    note("next call's first all_reduce", aborts=list(aborts))
    released.set()
    dist.destroy_process_group()

train()
note("done", pids=calls)
"""


@pytest.mark.timeout(120)
def test_the_next_call_does_not_wait_for_the_old_groups_abort(write_script, tmp_path):
    out = tmp_path / "events.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
                           write_script("held.py", SCRIPT), str(out)], timeout=110)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["event"] for e in events] == ["raising", "next call's first all_reduce", "done"], events
    # Same process; the old group's abort had begun and had not finished when the next call's
    # first all-reduce was done.
    assert len(set(events[-1]["pids"])) == 1 and len(events[-1]["pids"]) == 2, events
    assert events[1]["aborts"] == ["started"], events
    assert "recovering in place" in result.stderr, result.stderr


#: The old group's abort is still running when the process ends (NCCL's teardown after a short
#: last call): the exit waits for it rather than tear the runtime down under it.
SCRIPT_ENDING_DURING_THE_ABORT = SCRIPT.replace(
    "    released.wait(60)\n    real_abort(group)\n    aborts.append(\"finished\")\n",
    "    released.wait(60)\n    time.sleep(0.5)\n    real_abort(group)\n    aborts.append(\"finished\")\n"
    "    note(\"old group aborted\")\n",
)


@pytest.mark.timeout(120)
def test_a_process_that_ends_during_the_old_groups_abort_waits_for_it(write_script, tmp_path):
    assert SCRIPT_ENDING_DURING_THE_ABORT != SCRIPT
    out = tmp_path / "events.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
                           write_script("held.py", SCRIPT_ENDING_DURING_THE_ABORT), str(out)], timeout=110)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line)["event"] for line in out.read_text().splitlines()]
    assert events == ["raising", "next call's first all_reduce", "done", "old group aborted"], events
