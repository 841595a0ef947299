"""When recovery in place cannot be done, the full restart of today, with one line saying why."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from tests.conftest import LAUNCHER, launcher_env, run_launcher

#: Local rank 0 raises in its first attempt; local rank 1 runs the same code without the wrapper
#: when WRAP_ALL is unset (it is still running, unregistered, when rank 0 raises).
SCRIPT = """
import os, time
import launcher

# Rank 0 fails once rank 1 is inside its own function (an event, not a delay): it says so in a file.
PEER_INSIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank1-inside")

def wait_for_the_peer():
    while not os.path.exists(PEER_INSIDE):
        time.sleep(0.01)

def work():
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"rank {os.environ['RANK']} pid {os.getpid()} attempt {attempt}", flush=True)
    if attempt == "0":
        if os.environ["LOCAL_RANK"] == "0":
            wait_for_the_peer()
            raise ValueError("boom")
        open(PEER_INSIDE, "w").close()
        time.sleep(30)

if os.environ.get("WRAP_ALL") or os.environ["LOCAL_RANK"] == "0":
    launcher.recoverable(work)()
else:
    work()
"""


def attempts(stdout: str, rank: int) -> list[tuple[int, int]]:
    """``(pid, attempt)`` of each start of ``rank``."""
    found = []
    for line in stdout.splitlines():
        if f"rank {rank} pid " in line:
            words = line.split()
            found.append((int(words[words.index("pid") + 1]), int(words[-1])))
    return found


def test_a_rank_without_the_wrapper_means_a_full_restart(write_script, tmp_path):
    events = tmp_path / "events.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--event-log-handler",
                           "jsonl", write_script("mixed.py", SCRIPT)], env={"LAUNCHER_EVENTS_FILE": str(events)})
    assert result.returncode == 0, result.stderr
    why = [line for line in result.stderr.splitlines() if "in-place recovery not possible" in line]
    assert len(why) == 1, result.stderr
    assert "local rank 1 (pid" in why[0] and "did not register with launcher.recoverable" in why[0]
    assert "restarting every worker" in why[0]
    assert "exited with code 1; restarting (0 of 1 restarts left)" in result.stderr  # the raised rank's exit
    assert "recovering in place" not in result.stderr
    first, second = attempts(result.stdout, 0)
    assert first[1] == 0 and second[1] == 1 and first[0] != second[0]  # a new process
    [restart] = [json.loads(line)["data"] for line in events.read_text().splitlines()
                 if json.loads(line)["type"] == "group_restarted"]
    assert restart["mode"] == "restart" and "did not register with launcher.recoverable" in restart["fallback"]


def test_recovery_restart_flag_restarts_every_worker(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--recovery", "restart",
                           write_script("all.py", SCRIPT)], env={"WRAP_ALL": "1"})
    assert result.returncode == 0, result.stderr
    assert "recovering in place" not in result.stderr and "not possible" not in result.stderr
    assert "restarting (0 of 1 restarts left)" in result.stderr
    assert len({pid for pid, _ in attempts(result.stdout, 1)}) == 2


def test_without_restarts_left_the_exception_ends_the_job_as_today(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", write_script("all.py", SCRIPT)],
                          env={"WRAP_ALL": "1"})
    assert result.returncode == 1
    assert "Root cause" in result.stderr and "ValueError: boom" in result.stderr
    assert "exit code 1" in result.stderr
    assert "recovering in place" not in result.stderr and "not possible" not in result.stderr


def test_the_wrapper_is_a_pass_through_outside_launcher():
    code = (
        "import launcher\n"
        "@launcher.recoverable\n"
        "def f(x):\n"
        "    return x * 2\n"
        "@launcher.recoverable\n"
        "def g():\n"
        "    raise KeyError('k')\n"
        "assert f(21) == 42 and f.__name__ == 'f'\n"
        "try:\n"
        "    g()\n"
        "except KeyError:\n"
        "    print('raised as is')\n"
        "import sys\n"
        "assert 'torch' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=launcher_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "raised as is"


def test_bad_recovery_flags_are_one_line_and_exit_2(write_script):
    script = write_script("noop.py", "pass\n")
    for args, expected in ((["--recovery", "sometimes"], "--recovery 'sometimes' is invalid: use in-place or restart"),
                           (["--recovery-timeout", "-3"], "--recovery-timeout")):
        result = run_launcher(["--standalone", *args, script])
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], result.stderr


#: Local rank 0 raises; local rank 1 is in a long C call (time.sleep) that an interrupt cannot end.
STUCK = """
import os, time
import launcher

# Rank 0 fails once rank 1 is inside its own function (an event, not a delay): it says so in a file.
PEER_INSIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank1-inside")

def wait_for_the_peer():
    while not os.path.exists(PEER_INSIDE):
        time.sleep(0.01)

@launcher.recoverable
def work():
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"rank {os.environ['RANK']} pid {os.getpid()} attempt {attempt}", flush=True)
    if attempt == "0":
        if os.environ["LOCAL_RANK"] == "0":
            wait_for_the_peer()
            raise ValueError("boom")
        open(PEER_INSIDE, "w").close()
        time.sleep(60)

work()
"""


def test_a_worker_that_does_not_leave_in_time_means_a_full_restart(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--recovery-timeout", "1",
                           write_script("stuck.py", STUCK)], timeout=60)
    assert result.returncode == 0, result.stderr
    why = [line for line in result.stderr.splitlines() if "in-place recovery not possible" in line]
    assert len(why) == 1, result.stderr
    assert "local rank 1 (pid" in why[0] and "did not leave its function within 1s (--recovery-timeout)" in why[0]
    assert "restarting (0 of 1 restarts left)" in result.stderr
    assert len({pid for pid, _ in attempts(result.stdout, 1)}) == 2  # the stuck one was replaced


def test_a_signal_ends_the_wait_for_workers_to_leave(write_script):
    """SIGTERM while a worker is stuck and the agent waits (--recovery-timeout 60) for it to leave:
    the agent stops at once, as it does at any other time."""
    process = subprocess.Popen([*LAUNCHER, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                                "--recovery-timeout", "60", write_script("stuck.py", STUCK)],
                               env=launcher_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        seen = []
        for line in process.stderr:  # rank 0's traceback is printed before it reports the raise
            seen.append(line)
            if "ValueError: boom" in line:
                break
        time.sleep(0.5)  # the agent is waiting for local rank 1, stuck in time.sleep(60)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        rest = process.communicate(timeout=50)[1]
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, "".join(seen) + rest
    assert took < 30, f"took {took:.1f} s after SIGTERM\n{rest}"
    assert "recovering in place" not in rest
