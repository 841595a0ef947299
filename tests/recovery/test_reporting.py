"""What a job says about its restarts at its end: in-place recoveries and full restarts, counted
apart, both against --max-restarts (launcher.agent.restart.RestartTally)."""

from __future__ import annotations

from tests.conftest import run_launcher

#: Local rank 0 raises in every attempt, once local rank 1 is inside its own function in that attempt
#: (registered with launcher.recoverable: an event, not a delay; a peer not registered yet when a
#: rank raises means a full restart): rank 1 says so in a file. Local rank 1 waits in short sleeps (an
#: interrupt ends them: it can be recovered in place), except in attempt 1 with STUCK_LATER set, where
#: it sits in one long sleep (a C call nothing ends: with --recovery-timeout 1 the agent falls back
#: to a full restart).
SCRIPT = """
import os, time
import launcher

INSIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank1-inside-")

@launcher.recoverable
def work():
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if os.environ["LOCAL_RANK"] == "0":
        while not os.path.exists(f"{INSIDE}{attempt}"):
            time.sleep(0.01)
        raise ValueError(f"boom {attempt}")
    open(f"{INSIDE}{attempt}", "w").close()
    if attempt == 1 and os.environ.get("STUCK_LATER"):
        time.sleep(30)
    for _ in range(600):
        time.sleep(0.05)

work()
"""


def test_the_report_counts_in_place_recoveries(write_script):
    # Attempt 0 fails and is recovered in place; attempt 1 fails with no restart left.
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                           write_script("fails.py", SCRIPT)], timeout=90)
    assert result.returncode == 1, result.stderr
    assert "recovering in place (0 of 1 restarts left)" in result.stderr
    assert "ValueError: boom 1" in result.stderr
    assert "\n  restarts used: 1 in-place recovery, 0 restarts (of --max-restarts 1)\n" in result.stderr, result.stderr


def test_the_report_counts_both_kinds_apart(write_script):
    # Attempt 0: in place. Attempt 1: local rank 1 does not leave within 1 s: a full restart.
    # Attempt 2 fails with no restart left.
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--recovery-timeout", "1",
                           write_script("fails.py", SCRIPT)], env={"STUCK_LATER": "1"}, timeout=90)
    assert result.returncode == 1, result.stderr
    assert "recovering in place (1 of 2 restarts left)" in result.stderr
    assert "restarting (0 of 2 restarts left)" in result.stderr
    assert "\n  restarts used: 1 in-place recovery, 1 restart (of --max-restarts 2)\n" in result.stderr, result.stderr
