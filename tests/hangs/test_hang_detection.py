"""Single node, real workers: a stuck rank is found, named, shown where it is, and stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launcher.errors import UsageError

from tests.conftest import LAUNCHER, launcher_env, run_launcher, unwrapped

STUCK = """
import os, sys, time
import launcher

def stuck_in_known_function():
    while True:
        time.sleep(0.5)

rank = int(os.environ["RANK"])
out = sys.argv[1]
open(os.path.join(out, f"pid.{rank}"), "w").write(str(os.getpid()))
launcher.heartbeat()
if rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == sys.argv[2]:
    open(os.path.join(out, "stuck_at"), "w").write(repr(time.time()))
    stuck_in_known_function()
for _ in range(int(sys.argv[3])):
    launcher.heartbeat()
    time.sleep(0.05)
"""


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is gone for our purpose (nothing left to run), until someone reaps it.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if not gone(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def test_stuck_rank_is_named_with_its_function_and_every_worker_is_stopped(write_script, tmp_path):
    script = write_script("stuck.py", STUCK)
    out = tmp_path / "out"
    out.mkdir()
    events = tmp_path / "events.jsonl"
    logs = tmp_path / "logs"
    process = subprocess.Popen(
        [*LAUNCHER, "--nproc-per-node", "3", "--hang-timeout", "3", "--log-dir", str(logs),
         "--event-log-handler", "jsonl", script, str(out), "0", "100000"],
        env=launcher_env({"LAUNCHER_EVENTS_FILE": str(events)}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    reported_at = None
    lines = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if reported_at is None and "hang detected" in line:
                reported_at = time.time()
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = "".join(lines)
    assert code == 1, stderr
    assert reported_at is not None, stderr
    stuck_at = float((out / "stuck_at").read_text())
    delay = reported_at - stuck_at
    print(f"\nhang report {delay:.2f} s after the last heartbeat (--hang-timeout 3)")
    # The bound: within the timeout + 5 s (a check every 0.75 s, then the dump).
    assert 3 <= delay < 3 + 5, stderr

    # The hung rank is named, with the function it is stuck in; the others are elsewhere.
    assert re.search(r"^  rank 1 on \S+ \(local rank 1, pid \d+\): no heartbeat for", stderr, re.M), stderr
    assert re.search(r"^  rank 1: stuck_in_known_function \(stuck\.py:\d+\) <- <module>", stderr, re.M), stderr
    assert re.search(r"^  ranks 0, 2: <module> \(stuck\.py:\d+\)$", stderr, re.M), stderr

    pids = [int((out / f"pid.{rank}").read_text()) for rank in range(3)]
    assert wait_gone(pids) == []

    # The failure report (console and JSON) says it was a hang; full stacks are next to the logs.
    assert "a rank hung; the workers were stopped" in stderr
    # Its stacks taken, the hung rank is killed at once, not given the grace (issue 45).
    assert "hung: it stopped making progress past --hang-timeout; the launcher killed it at once (SIGKILL)" in \
        unwrapped(stderr), stderr
    [report_path] = logs.glob("*/failure_report.json")
    report = json.loads(report_path.read_text())
    assert report["hang"]["hung_ranks"] == [1]
    groups = {tuple(g["ranks"]): g["stack"] for g in report["hang"]["groups"]}
    assert "stuck_in_known_function" in groups[(1,)] and "stuck_in_known_function" not in groups[(0, 2)]
    # The main thread's (a worker also runs launcher's flight-recorder thread, launcher.hangs.flightrec).
    frames = {
        entry["rank"]: next(thread for thread in entry["stacks"]["threads"] if thread["main"])["frames"]
        for node in report["hang"]["nodes"] for entry in node["ranks"]
    }
    assert frames[1][0]["function"] == "stuck_in_known_function"
    [stacks_file] = logs.glob("*/hang_stacks_attempt_0.txt")
    assert 'in stuck_in_known_function' in stacks_file.read_text()
    assert str(stacks_file) in unwrapped(stderr)

    [event] = [e for e in map(json.loads, events.read_text().splitlines()) if e["type"] == "hang_detected"]
    assert event["data"]["hung_ranks"] == [1]
    assert event["data"]["stacks_file"] == str(stacks_file)


def test_a_hang_uses_a_restart_and_says_so(write_script, tmp_path):
    script = write_script("stuck.py", STUCK)
    out = tmp_path / "out"
    out.mkdir()
    events = tmp_path / "events.jsonl"
    result = run_launcher(
        ["--nproc-per-node", "2", "--hang-timeout", "1", "--max-restarts", "1", "--event-log-handler", "jsonl",
         script, str(out), "0", "10"],
        env={"LAUNCHER_EVENTS_FILE": str(events)}, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "restarting them (restart 1 of 1)" in result.stderr
    assert re.search(r"worker group hung: rank 1 \(local rank 1\): no heartbeat", result.stderr), result.stderr
    kinds = [json.loads(line) for line in events.read_text().splitlines()]
    [restart] = [e for e in kinds if e["type"] == "group_restarted"]
    assert restart["data"]["cause"] == "hang" and restart["data"]["count"] == 1
    assert [e["data"]["restart_count"] for e in kinds if e["type"] == "workers_started"] == [0, 1]


def test_silent_ranks_quiet_sections_and_finished_ranks_are_not_hangs(write_script):
    script = write_script(
        "quiet.py",
        """
        import os, time
        import launcher
        if os.environ["RANK"] == "0":
            time.sleep(3)  # never beats: not watched
        elif os.environ["RANK"] == "2":
            launcher.heartbeat()  # then ends at once, successfully: done, not hung
        else:
            launcher.heartbeat()
            with launcher.quiet("checkpoint", timeout=60):
                time.sleep(3)
            launcher.heartbeat()
        """,
    )
    result = run_launcher(["--nproc-per-node", "3", "--hang-timeout", "1", script], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "hang detected" not in result.stderr


def test_output_watching_and_function_workers(write_script):
    """--hang-watch output: a line is a beat; --run-path workers (no start-up hook) show stacks too."""
    script = write_script(
        "talk.py",
        """
        import os, time

        def silent_forever():
            time.sleep(600)

        for step in range(3):
            print("step", step, flush=True)
        if os.environ["RANK"] == "1":
            silent_forever()
        for step in range(400):
            print("step", step, flush=True)
            time.sleep(0.05)
        """,
    )
    result = run_launcher(
        ["--nproc-per-node", "2", "--hang-timeout", "2", "--hang-watch", "output", "--run-path", script], timeout=60
    )
    assert result.returncode == 1, result.stderr
    assert re.search(r"^  rank 1 on \S+ .*no heartbeat or output line for", result.stderr, re.M), result.stderr
    assert re.search(r"^  rank 1: silent_forever \(talk\.py:\d+\)", result.stderr, re.M), result.stderr


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        (["--hang-timeout", "0"], {}),
        (["--hang-timeout", "-3"], {}),
        (["--hang-timeout", "nan"], {}),
        (["--hang-timeout", "inf"], {}),
        (["--hang-timeout", "1_0"], {}),
        (["--hang-timeout", "\u0663"], {}),  # an Arabic-Indic digit: float() takes it, we do not
        (["--hang-timeout", "soon"], {}),
        (["--hang-timeout", "604801"], {}),  # like every timeout: at most a week
        (["--hang-timeout", "1e999"], {}),
        ([], {"PET_HANG_TIMEOUT": "never"}),
        (["--hang-timeout", "5", "--hang-watch", "logs"], {}),
    ],
)
def test_bad_hang_settings_are_one_line_exit_2(flags, env, write_script, tmp_path):
    marker = tmp_path / "started"
    script = write_script("marker.py", f"open({str(marker)!r}, 'a').write('x')\n")
    result = run_launcher([*flags, script], env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    # The message names the value as the user gave it: the flag, or its PET_ variable.
    assert lines[0].startswith("launcher: error: PET_HANG_TIMEOUT " if env else "launcher: error: --hang-"), lines
    assert not marker.exists()


def test_the_hang_timeout_reads_numbers_like_every_timeout():
    from launcher.hangs.settings import parse_hang_timeout

    assert parse_hang_timeout("300") == 300.0
    assert parse_hang_timeout("2.5") == 2.5
    assert parse_hang_timeout("1e3") == 1000.0
    assert parse_hang_timeout("604800") == 604800.0
    assert parse_hang_timeout("") is None and parse_hang_timeout(None) is None
    with pytest.raises(UsageError, match=r"^PET_HANG_TIMEOUT must be a number of seconds above 0 and at most 604800, "
                                         r"got '0'$"):
        parse_hang_timeout("0", "PET_HANG_TIMEOUT")


def test_sigusr2_to_the_agent_prints_every_rank_and_the_job_goes_on(write_script, tmp_path):
    # Each rank waits inside waiting_for_godot (blocked in C, no frame of its own) until the test
    # has read the report and hands it one byte: no rank can leave before the report, however slow.
    # It says it is ready on the line where it waits: said on a line before, the test could ask for
    # the report while a rank was still there, and the ranks would not be shown as one group.
    script = write_script(
        "godot.py",
        """
        import os, sys
        import launcher

        def waiting_for_godot():
            ready = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(ready, b"x"); os.read(os.open(sys.argv[2], os.O_RDONLY), 1)

        launcher.heartbeat()
        waiting_for_godot()
        """,
    )
    ready, godot, err = tmp_path / "ready", tmp_path / "godot", tmp_path / "agent.stderr"
    os.mkfifo(godot)
    go = os.open(godot, os.O_RDWR)  # a writer from the start: the ranks' opens never block
    with err.open("w") as err_file:
        process = subprocess.Popen(
            [*LAUNCHER, "--nproc-per-node", "2", "--hang-timeout", "60", script, str(ready), str(godot)],
            env=launcher_env(), stdout=subprocess.DEVNULL, stderr=err_file, text=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not (ready.exists() and len(ready.read_text()) == 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGUSR2)
        while "ranks 0-1: waiting_for_godot" not in err.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, err.read_text()
            time.sleep(0.05)
        os.write(go, b"xx")  # one byte for each rank
        process.wait(timeout=60)
        stderr = err.read_text()
    finally:
        os.close(go)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert "where every rank on" in stderr and "stacks asked for with SIGUSR2" in stderr, stderr
    assert re.search(r"^  ranks 0-1: waiting_for_godot \(godot\.py:\d+\) <- <module>", stderr, re.M), stderr
    assert "hang detected" not in stderr


def test_the_bootstrap_is_invisible_to_the_worker(write_script, tmp_path):
    """The worker's PYTHONPATH and sys.path are what the user gave; their sitecustomize still runs."""
    user_site = tmp_path / "user_site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = True\n")
    script = write_script(
        "look.py",
        """
        import builtins, json, os, sys
        print(json.dumps({
            "pythonpath": os.environ.get("PYTHONPATH"),
            "ours_on_path": any(p.rstrip("/").endswith("hangs/_site") for p in sys.path),
            "user_site_ran": getattr(builtins, "USER_SITE_RAN", False),
            "armed": os.environ.get("LAUNCHER_STACKS_ARMED") == str(os.getpid()),
        }))
        """,
    )
    result = run_launcher(["--hang-timeout", "30", script], env={"PYTHONPATH": str(user_site)}, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {"pythonpath": str(user_site), "ours_on_path": False, "user_site_ran": True, "armed": True}


def test_a_program_that_is_not_python_is_shown_by_its_process_state(tmp_path):
    program = tmp_path / "stall.sh"
    program.write_text("#!/bin/sh\necho started\nexec sleep 30\n")
    program.chmod(0o755)
    result = run_launcher(
        ["--hang-timeout", "2", "--hang-watch", "output", "--no-python", str(program)], timeout=60
    )
    assert result.returncode == 1, result.stderr
    line = next((ln for ln in result.stderr.splitlines() if ln.startswith("  rank 0: ")), "")
    assert "no Python stack: the worker did not arm stack dumps" in line, result.stderr
    assert "S (sleeping)" in line, result.stderr
