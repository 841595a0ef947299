"""``--max-no-progress-restarts``: a job whose restarts fail before passing the furthest step it
reached stops with exit status 93 (do not requeue), naming the step (docs/failures.md).

Real launcher runs with standard-library workers that give their steps to ``launcher.heartbeat``.
"""

from __future__ import annotations

import pytest
from launcher.agent.progress import EXIT_NO_PROGRESS, combine

from tests.conftest import run_launcher

#: Each attempt prints its number, gives steps up to the step STOP(attempt) and fails there.
#: Before its first step it waits for the agent's step directory, which the agent makes once its
#: first workers run: without the wait, a first attempt this short could be over before it.
WORKER = """
import os, sys, time
import launcher
from launcher.hangs.progress import step_dirs
from launcher.recovery import own_token

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"attempt {{attempt}} rank {{os.environ['RANK']}}", flush=True)
deadline = time.monotonic() + 60
while {wait} and not any(os.path.isdir(d) for d in step_dirs(own_token())) and time.monotonic() < deadline:
    time.sleep(0.01)
stop = {stop}
for step in range(1, stop + 1):
    launcher.heartbeat(step)
sys.exit(3)
"""


def worker(write_script, stop: str, wait: bool = True) -> str:
    return write_script("train.py", WORKER.format(stop=stop, wait=wait))


def attempts(stdout: str) -> int:
    """How many attempts started (each worker's line is ``[default<n>]:attempt <n> ...``)."""
    return len({line.split("attempt ", 1)[1].split()[0] for line in stdout.splitlines() if "attempt " in line})


def test_same_step_every_attempt_stops_after_three_restarts(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "5",
                           "--max-no-progress-restarts", "3", worker(write_script, "41")])
    assert result.returncode == EXIT_NO_PROGRESS == 93, result.stderr
    # The first attempt reached step 41; restarts 1, 2 and 3 ended before passing it.
    assert attempts(result.stdout) == 4, result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert ("no progress in 3 restarts in a row: each ended before passing step 41 (the furthest the job "
            "reached); not restarting (exit 93: do not requeue)") in last, result.stderr
    assert "Traceback" not in last


def test_failing_at_the_same_step_three_times(write_script, tmp_path):
    """The issue's case: three failures at one step, two restarts in a row without progress."""
    events = tmp_path / "events.jsonl"
    result = run_launcher(["--standalone", "--max-restarts", "5", "--max-no-progress-restarts", "2",
                           "--event-log-handler", "jsonl", worker(write_script, "7")],
                          env={"LAUNCHER_EVENTS_FILE": str(events)})
    assert result.returncode == 93, result.stderr
    assert attempts(result.stdout) == 3, result.stdout
    assert "each ended before passing step 7" in result.stderr.strip().splitlines()[-1]
    import json

    failed = [e for e in map(json.loads, events.read_text().splitlines()) if e.get("type") == "job_failed"]
    assert failed and failed[-1]["data"]["reason"] == "no progress", failed
    assert failed[-1]["data"]["step"] == 7 and failed[-1]["data"]["no_progress_restarts"] == 2


def test_progress_every_attempt_uses_every_restart(write_script):
    # Steps 3, 6, 9, 12, 15: each attempt passes the last one.
    result = run_launcher(["--standalone", "--max-restarts", "4", "--max-no-progress-restarts", "1",
                           worker(write_script, "3 * (attempt + 1)")])
    assert result.returncode == 1, result.stderr
    assert attempts(result.stdout) == 5
    assert "no progress" not in result.stderr


@pytest.mark.parametrize("flag", [[], ["--max-no-progress-restarts", "0"]], ids=["no-steps", "off"])
def test_jobs_it_cannot_or_may_not_judge_use_every_restart(write_script, flag):
    if flag:  # off: the same step every time, yet every restart is used, as under torchrun
        script = worker(write_script, "5", wait=False)
    else:  # no step given at all: nothing to judge, the default tracker never fires
        script = write_script("train.py", "import os, sys\nprint('attempt', os.environ['TORCHELASTIC_RESTART_COUNT'],"
                                          " flush=True)\nsys.exit(3)\n")
    result = run_launcher(["--standalone", "--max-restarts", "3", *flag, script])
    assert result.returncode == 1, result.stderr
    assert attempts(result.stdout) == 4
    assert "no progress" not in result.stderr


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--max-no-progress-restarts", "-1"], {}, "--max-no-progress-restarts"),
    (["--max-no-progress-restarts", "three"], {}, "--max-no-progress-restarts"),
    (["--max_no_progress_restarts", "1.5"], {}, "--max-no-progress-restarts"),
    ([], {"PET_MAX_NO_PROGRESS_RESTARTS": "x"}, "PET_MAX_NO_PROGRESS_RESTARTS"),
])
def test_bad_values_are_one_line_and_exit_2(write_script, tmp_path, args, env, named):
    marker = tmp_path / "started"
    script = write_script("w.py", f"open({str(marker)!r}, 'w').close()\n")
    result = run_launcher(["--standalone", "--max-restarts", "2", *args, script], env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert named in lines[0] and "must be an integer from 0 to" in lines[0], lines[0]
    assert not marker.exists()


def test_the_nodes_records_combine_into_one_state():
    """What group rank 0 computes for every node of a round (launcher.agent.ranks carries it)."""
    # [node's furthest step, a failure used a restart, its state's step, its count]
    assert combine([None, None]) is None  # no node keeps a record
    assert combine([[None, True, None, 0]]) == [None, 0]  # no step given: nothing counted
    assert combine([[41, False, None, 0], [40, False, None, 0]]) == [41, 0]  # the furthest node counts
    assert combine([[41, True, 41, 0], [41, False, 41, 0]]) == [41, 1]  # one node's failure is the job's
    assert combine([[41, True, 41, 2], [None, False, None, 0]]) == [41, 3]  # a spare that just joined
    assert combine([[42, True, 41, 2], [41, True, 41, 2]]) == [42, 0]  # one node passed it: progress
    assert combine([[41, False, 41, 2], [41, False, 41, 2]]) == [41, 2]  # a re-form counts nothing
