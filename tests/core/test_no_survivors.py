"""Every process a job starts is gone soon after the job ends, at any depth and in any session.

Each worker starts (a) a plain child, (b) a child in a session of its own
(``start_new_session=True``) and (c) a double-forked ``setsid`` daemon whose parent exits. The
launcher is started with a unique marker variable in its environment, which every process of the
run inherits (the agent, its watchdog, the workers and everything below them), so a scan of
``/proc/*/environ`` for the marker finds whatever is left, recorded or not. Each case prints a
``FIGURE`` line (``pytest -s``) with the leftovers and the time from the launcher's end until none
was left.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import LAUNCHER, launcher_env

#: The requirement is 2 s; the slack keeps the tests robust on a loaded machine.
DEADLINE = 12.0

FAMILY = """
import os, subprocess, sys, time

out, mode = sys.argv[1], sys.argv[2]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
rank = os.environ["LOCAL_RANK"]
world = int(os.environ["LOCAL_WORLD_SIZE"])
if "IGNORE_SIGNALS" in os.environ:
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if mode == "restart" and attempt == "1":
    # The replacement group: record which processes of the failed group are still alive.
    old = [int(p) for name in os.listdir(out) if name.startswith("0.")
           for p in open(os.path.join(out, name)).read().split()]
    with open(os.path.join(out, f"stale.{rank}"), "w") as f:
        f.write(" ".join(str(p) for p in old if alive(p)))
    sys.exit(0)

sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
plain = subprocess.Popen(sleeper)
session = subprocess.Popen(sleeper, start_new_session=True)
r, w = os.pipe()
middle = os.fork()
if middle == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        time.sleep(600)
    os._exit(0)
os.close(w)
daemon = int(os.read(r, 64))
os.waitpid(middle, 0)
with open(os.path.join(out, f"tmp.{attempt}.{rank}"), "w") as f:
    f.write(f"{os.getpid()} {plain.pid} {session.pid} {daemon}")
os.replace(os.path.join(out, f"tmp.{attempt}.{rank}"), os.path.join(out, f"{attempt}.{rank}"))

if mode == "success":
    sys.exit(0)
if mode in ("failure", "restart"):
    # Fail only once every worker of this attempt has recorded its family.
    while len([n for n in os.listdir(out) if n.startswith(f"{attempt}.")]) < world:
        time.sleep(0.01)
    if rank == "0":
        sys.exit(3)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _marked(marker: str, include_watchdog: bool = True) -> list[int]:
    """Live processes whose environment holds ``marker``."""
    needle = marker.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            if not include_watchdog:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"_watchdog_main" in f.read():
                        continue
        except OSError:
            continue
        if _alive(int(entry)):
            found.append(int(entry))
    return found


def _gone_after(marker: str, timeout: float = DEADLINE) -> tuple[list[int], float, float]:
    """Poll until no process of the run is left: (leftovers, seconds until the job's were gone,
    seconds until the watchdog was gone too)."""
    started = time.monotonic()
    job_gone = None
    while True:
        now = time.monotonic()
        if job_gone is None and not _marked(marker, include_watchdog=False):
            job_gone = now - started
        left = _marked(marker)
        if not left:
            return [], job_gone if job_gone is not None else now - started, now - started
        if now - started > timeout:
            return left, job_gone if job_gone is not None else float("nan"), now - started
        time.sleep(0.02)


def _kill_marked(marker: str) -> None:
    for pid in _marked(marker):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class Run:
    """One launcher run of the FAMILY script, marked so that all its processes can be found."""

    def __init__(self, script: str, out: Path, mode: str, *flags: str, env: dict[str, str] | None = None):
        self.marker = f"LIFETIME_TEST_{uuid.uuid4().hex}"
        self.out = out
        out.mkdir()
        self.proc = subprocess.Popen(
            [*LAUNCHER, "--standalone", "--nproc-per-node", "2", *flags, script, str(out), mode],
            env=launcher_env({self.marker: "1", **(env or {})}),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )

    def families(self, attempt: int = 0, timeout: float = 60) -> list[int]:
        """Every recorded pid of ``attempt`` (4 per worker), once both workers recorded theirs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            names = [n for n in os.listdir(self.out) if n.startswith(f"{attempt}.")]
            if len(names) == 2:
                return [int(p) for n in names for p in (self.out / n).read_text().split()]
            if self.proc.poll() is not None and len(names) < 2:
                break
            time.sleep(0.02)
        raise AssertionError(f"workers did not record their families: {os.listdir(self.out)}")

    def finish(self, timeout: float = 120) -> str:
        _, stderr = self.proc.communicate(timeout=timeout)
        return stderr.decode(errors="replace")

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        _kill_marked(self.marker)


@pytest.fixture
def family(write_script, tmp_path):
    script = write_script("family.py", FAMILY)
    runs: list[Run] = []

    def start(mode: str, *flags: str, name: str = "out", env: dict[str, str] | None = None) -> Run:
        run = Run(script, tmp_path / name, mode, *flags, env=env)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.cleanup()


def _report(case: str, pids: list[int], left: list[int], job_gone: float, all_gone: float) -> None:
    print(f"\nFIGURE case={case} recorded={len(pids)} leftovers={len(left)} "
          f"job_gone_s={job_gone:.3f} watchdog_gone_s={all_gone:.3f}")


def test_success_leaves_no_descendant(family):
    run = family("success")
    stderr = run.finish()
    assert run.proc.returncode == 0, stderr
    pids = run.families()
    left, job_gone, all_gone = _gone_after(run.marker)
    _report("success", pids, left, job_gone, all_gone)
    assert not left, f"processes outlived a successful job: {left}"
    assert not [p for p in pids if _alive(p)]


def test_failure_leaves_no_descendant(family):
    run = family("failure", "--max-restarts", "0")
    stderr = run.finish()
    assert run.proc.returncode == 1, stderr
    pids = run.families()
    left, job_gone, all_gone = _gone_after(run.marker)
    _report("failure", pids, left, job_gone, all_gone)
    assert not left, f"processes outlived a failed job: {left}"


def test_restart_kills_the_old_groups_descendants_before_the_new_group(family):
    run = family("restart", "--max-restarts", "1")
    stderr = run.finish()
    assert run.proc.returncode == 0, stderr
    old = run.families(0)
    stale = " ".join((run.out / f"stale.{rank}").read_text() for rank in (0, 1)).split()
    assert not stale, f"the failed group's processes were alive when its replacement started: {stale}"
    left, job_gone, all_gone = _gone_after(run.marker)
    _report("restart", old, left, job_gone, all_gone)
    assert not left


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_leaves_no_descendant(family, signum):
    run = family("wait")
    pids = run.families()
    assert all(_alive(pid) for pid in pids)
    run.proc.send_signal(signum)
    stderr = run.finish()
    assert run.proc.returncode == 128 + signum, stderr
    left, job_gone, all_gone = _gone_after(run.marker)
    _report(signal.Signals(signum).name, pids, left, job_gone, all_gone)
    assert not left, f"processes outlived the job after {signal.Signals(signum).name}: {left}"


def test_sigkill_of_agent_leaves_no_descendant(family):
    run = family("wait")
    pids = run.families()
    assert all(_alive(pid) for pid in pids)
    run.proc.kill()
    run.proc.wait(30)
    left, job_gone, all_gone = _gone_after(run.marker)
    _report("SIGKILL", pids, left, job_gone, all_gone)
    assert not left, f"processes outlived the SIGKILLed agent: {left}"


def test_sigkill_at_random_moments_of_start_up(family):
    rng = random.Random(20261123)
    results = []
    for iteration in range(20):
        delay = rng.uniform(0.0, 0.5)
        run = family("wait", name=f"out{iteration}")
        time.sleep(delay)
        run.proc.kill()
        run.proc.wait(30)
        left, job_gone, all_gone = _gone_after(run.marker)
        recorded = len(os.listdir(run.out))
        results.append((delay, recorded, len(left), job_gone, all_gone))
        run.cleanup()
    for delay, recorded, left, job_gone, all_gone in results:
        print(f"\nFIGURE case=sigkill-start delay_s={delay:.3f} families_recorded={recorded} "
              f"leftovers={left} job_gone_s={job_gone:.3f} watchdog_gone_s={all_gone:.3f}")
    assert all(left == 0 for _, _, left, _, _ in results), results


def test_second_signal_skips_the_grace_period(family):
    run = family("wait", "--shutdown-timeout", "300", env={"IGNORE_SIGNALS": "1"})
    pids = run.families()
    run.proc.send_signal(signal.SIGINT)
    time.sleep(1.0)  # the workers ignore it: the agent is now waiting out the grace period
    assert run.proc.poll() is None
    started = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    stderr = run.finish(timeout=120)
    elapsed = time.monotonic() - started
    assert run.proc.returncode == 128 + signal.SIGINT, stderr
    assert "killing it now" in stderr
    # Far below the 300 s grace period, with room for a loaded machine.
    assert elapsed < 100
    left, job_gone, all_gone = _gone_after(run.marker)
    _report("second-SIGINT", pids, left, job_gone, all_gone)
    print(f"FIGURE case=second-SIGINT exit_after_second_signal_s={elapsed:.3f}")
    assert not left


def test_concurrent_jobs_do_not_kill_each_others_processes(family):
    bystander = family("wait", name="bystander")
    theirs = bystander.families()
    # Another job that succeeds (its stop-time sweep), then one whose agent is SIGKILLed (its watchdog).
    done = family("success", name="done")
    stderr = done.finish()
    assert done.proc.returncode == 0, stderr
    assert not _gone_after(done.marker)[0]
    killed = family("wait", name="killed")
    killed.families()
    killed.proc.kill()
    killed.proc.wait(30)
    assert not _gone_after(killed.marker)[0]
    assert all(_alive(pid) for pid in theirs), [pid for pid in theirs if not _alive(pid)]
    assert bystander.proc.poll() is None
    bystander.proc.send_signal(signal.SIGTERM)
    bystander.finish()
    assert not _gone_after(bystander.marker)[0]


def test_job_processes_matches_only_the_token(tmp_path):
    from launcher.agent._watchdog_main import job_processes

    token = uuid.uuid4().hex
    mine = subprocess.Popen([*LAUNCHER[:1], "-c", "import time; time.sleep(600)"],
                            env={**os.environ, "LAUNCHER_JOB_TOKEN": f"outer:{token}"})
    other = subprocess.Popen([*LAUNCHER[:1], "-c", "import time; time.sleep(600)"],
                             env={**os.environ, "LAUNCHER_JOB_TOKEN": uuid.uuid4().hex})
    try:
        deadline = time.monotonic() + 30
        while mine.pid not in job_processes(token) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert job_processes(token) == [mine.pid]
        assert job_processes("") == []
    finally:
        for proc in (mine, other):
            proc.kill()
            proc.wait()
