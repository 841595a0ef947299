"""Every process a job starts is gone soon after the job ends, at any depth, in any session, with any
environment.

Each worker starts seven kinds of process (``KINDS``): itself, (a) a plain child, (b) a child in a
session of its own (``start_new_session=True``), (c) a double-forked ``setsid`` daemon whose parent
exits, and the audit's three that drop the job's environment (and so its token): (d) an
env-cleared child with ``start_new_session=True``, (e) an env-cleared child with
``process_group=0``, (f) a double-forked ``setsid`` daemon that ``execve``'s with an empty
environment. Every one carries the run's marker in its argv (the workers and (a)-(c) in their
environment too), so a scan of ``/proc`` finds whatever is left, recorded or not. Survivors must be
gone within ``GONE_WITHIN`` seconds of the agent's own exit (polled, so a loaded machine costs no
flakiness until then). Each case prints a ``FIGURE`` line (``pytest -s``) with the leftovers by kind
and the time from the launcher's end until none was left.

Where a cgroup v2 is writable the job's processes must all be in the job's cgroup, and the cgroup
must be gone after the run; elsewhere those assertions are skipped and the child-subreaper
fallback is what is tested (``LAUNCHER_CONTAINMENT=subreaper`` forces it everywhere).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from launcher.containment.cgroups import (
    cgroup2_directory,
    cgroup2_mounts,
    cgroup2_path,
    current_cgroup_directory,
)
from launcher.containment.mode import requested_mode

from tests.conftest import LAUNCHER, launcher_env

#: What the issue asks: every process of the job gone within 2 s of the job's end.
GONE_WITHIN = 2.0
#: How long to look for leftovers before giving up (then the test fails with them listed).
LOOK_FOR = 15.0
#: The watchdog is the launcher's, not the job's: it exits once it has seen nothing for 0.5 s.
WATCHDOG_GONE_WITHIN = 10.0

KINDS = ("worker", "plain", "session", "daemon", "newsession", "pgroup", "noenv")

FAMILY = """
import os, shutil, subprocess, sys, time

out, mode, marker = sys.argv[1], sys.argv[2], sys.argv[3]
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
           for p in open(os.path.join(out, name)).readline().split()]
    with open(os.path.join(out, f"stale.{rank}"), "w") as f:
        f.write(" ".join(str(p) for p in old if alive(p)))
    sys.exit(0)


def double_fork(then):
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            then()
            os._exit(0)
        os._exit(0)
    os.close(w)
    pid = int(os.read(r, 64))
    os.close(r)
    os.waitpid(middle, 0)
    return pid


sleeper = [sys.executable, "-c", "import time; time.sleep(600)", marker]
plain = subprocess.Popen(sleeper)
session = subprocess.Popen(sleeper, start_new_session=True)
daemon = double_fork(lambda: time.sleep(600))
# The audit's three: they drop the job's environment, token included; argv[0] is the marker.
sleep = shutil.which("sleep") or "/bin/sleep"
bare = {"PATH": os.environ.get("PATH", os.defpath)}
newsession = subprocess.Popen([f"{marker}-newsession", "600"], executable=sleep, env=bare,
                              start_new_session=True)
if sys.version_info >= (3, 11):
    pgroup = subprocess.Popen([f"{marker}-pgroup", "600"], executable=sleep, env=bare, process_group=0)
else:
    pgroup = subprocess.Popen([f"{marker}-pgroup", "600"], executable=sleep, env=bare, preexec_fn=os.setpgrp)
noenv = double_fork(lambda: os.execve(sleep, [f"{marker}-noenv", "600"], {}))
cgroup = next((line[3:].strip() for line in open("/proc/self/cgroup") if line.startswith("0::")), "")
pids = [os.getpid(), plain.pid, session.pid, daemon, newsession.pid, pgroup.pid, noenv]
with open(os.path.join(out, f"tmp.{attempt}.{rank}"), "w") as f:
    f.write(" ".join(map(str, pids)) + "\\n" + cgroup + "\\n")
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


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _scan(marker: str) -> dict[int, bytes]:
    """Live processes with ``marker`` in their argv or environment: pid -> command line."""
    needle = marker.encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = _read(f"/proc/{entry}/cmdline")
            if needle not in cmdline and needle not in _read(f"/proc/{entry}/environ"):
                continue
        except OSError:
            continue
        if _alive(int(entry)):
            found[int(entry)] = cmdline
    return found


def _gone_after(marker: str, timeout: float = LOOK_FOR, since: float | None = None) -> tuple[list[int], float, float]:
    """Poll until no process of the run is left: (leftovers, seconds from ``since`` (default: now)
    until the job's were gone, until the watchdog was gone too)."""
    started = time.monotonic() if since is None else since
    job_gone = None
    while True:
        left = _scan(marker)
        now = time.monotonic()
        if job_gone is None and not [pid for pid, cmd in left.items() if not _is_watchdog(cmd)]:
            job_gone = now - started
        if not left or now - started > timeout:
            return sorted(left), job_gone if job_gone is not None else float("inf"), now - started
        time.sleep(0.01)


def _kill_marked(marker: str) -> None:
    for pid in _scan(marker):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _is_watchdog(cmdline: bytes) -> bool:
    return b"_watchdog_main" in cmdline


def _kind(cmdline: bytes, marker: str) -> str:
    argv0 = cmdline.split(b"\0", 1)[0].decode(errors="replace")
    if argv0.startswith(marker + "-"):
        return argv0[len(marker) + 1:]
    if _is_watchdog(cmdline):
        return "watchdog"
    return "python" if b"time.sleep(600)" in cmdline else "other"


# -- cgroups -------------------------------------------------------------------------------------


def _own_cgroup() -> tuple[str, str] | None:
    """(path, directory) of this process's cgroup v2, where one is mounted."""
    directory = current_cgroup_directory()
    path = cgroup2_path(Path("/proc/self/cgroup").read_text())
    return (path, directory) if directory is not None and path is not None else None


def _cgroup_writable() -> bool:
    """Whether a job cgroup can be made here (as the containment would: a directory below ours)."""
    own = _own_cgroup()
    if own is None:
        return False
    probe = os.path.join(own[1], f"launcher-test-probe-{uuid.uuid4().hex}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    os.rmdir(probe)
    return os.access(os.path.join(own[1], "cgroup.procs"), os.W_OK)


#: Whether the command line contains jobs in a cgroup here; if not, in the child-subreaper
#: fallback (``LAUNCHER_CONTAINMENT=subreaper`` in the tests' environment forces it for every run).
CGROUP = _cgroup_writable() and requested_mode() == "auto"
#: What the fallback may leave when the agent is SIGKILLed (docs/architecture.md): an orphan adopted
#: since the agent last registered its orphans with the watchdog, if it dropped the token and left
#: its worker's session. With a cgroup: nothing.
SIGKILL_GAP = frozenset() if CGROUP else frozenset({"noenv"})

pytestmark = pytest.mark.skipif(requested_mode() == "off", reason="LAUNCHER_CONTAINMENT=off: nothing to test")


def _job_cgroup(path: str) -> str | None:
    """The directory of the job cgroup that the cgroup ``path`` (a worker's) is in, if it is one."""
    own = _own_cgroup()
    if own is None or not path.startswith(own[0].rstrip("/") + "/"):
        return None
    first = path[len(own[0].rstrip("/")) + 1:].split("/")[0]
    return os.path.join(own[1], first) if first.startswith("launcher-") else None


def _remove_cgroup(directory: str) -> None:
    """Kill and remove a job cgroup a run of ours left (never one we did not make)."""
    with contextlib.suppress(OSError):
        Path(directory, "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 10
    while os.path.isdir(directory) and time.monotonic() < deadline:
        for sub, _, _ in os.walk(directory, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(sub)
        time.sleep(0.02)


# -- runs ----------------------------------------------------------------------------------------


class Run:
    """One launcher run of the FAMILY script, marked so that all its processes can be found."""

    def __init__(self, script: str, out: Path, mode: str, *flags: str, env: dict[str, str] | None = None):
        self.marker = f"LIFETIME_TEST_{uuid.uuid4().hex}"
        self.out = out
        out.mkdir()
        forced = {k: v for k, v in os.environ.items() if k == "LAUNCHER_CONTAINMENT"}  # launcher_env drops it
        env = {self.marker: "1", **forced, **(env or {})}
        self.containment = env.get("LAUNCHER_CONTAINMENT", "auto")
        self.proc = subprocess.Popen(
            [*LAUNCHER, "--standalone", "--nproc-per-node", "2", *flags, script, str(out), mode, self.marker],
            env=launcher_env(env),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        self.stderr_lines: list[str] = []
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        self.ended_at: float | None = None
        #: Job cgroups this run was seen to use (from its workers or its watchdog's command line).
        self.cgroups: set[str] = set()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line.decode(errors="replace"))

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def wait_for_log(self, needle: str, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while sum(needle in line for line in self.stderr_lines) < count:
            assert time.monotonic() < deadline and self.proc.poll() is None, self.stderr
            time.sleep(0.02)

    def recorded(self, attempt: int = 0) -> list[str]:
        return [n for n in os.listdir(self.out) if n.startswith(f"{attempt}.")]

    def families(self, attempt: int = 0, timeout: float = 60) -> list[int]:
        """Every recorded pid of ``attempt`` (7 per worker), once both workers recorded theirs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            names = self.recorded(attempt)
            if len(names) == 2:
                pids = []
                for name in names:
                    first, cgroup = (self.out / name).read_text().split("\n")[:2]
                    pids += [int(p) for p in first.split()]
                    job = _job_cgroup(cgroup)
                    if job is not None:
                        self.cgroups.add(job)
                return pids
            if self.proc.poll() is not None and len(names) < 2:
                break
            time.sleep(0.02)
        raise AssertionError(f"workers did not record their families: {os.listdir(self.out)}\n{self.stderr}")

    def worker_cgroups(self, attempt: int = 0) -> list[str]:
        return [(self.out / n).read_text().split("\n")[1] for n in self.recorded(attempt)]

    def finish(self, timeout: float = 120) -> str:
        self.proc.wait(timeout=timeout)
        self.ended_at = time.monotonic()
        self._reader.join(timeout=30)
        return self.stderr

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)
        self.ended_at = time.monotonic()
        self._note_watchdog()

    def _note_watchdog(self) -> None:
        # The watchdog outlives the agent by at least half a second, and its command line names
        # the job's cgroup: the way to know it when the agent died before any worker said.
        for cmdline in _scan(self.marker).values():
            if _is_watchdog(cmdline):
                args = cmdline.rstrip(b"\0").split(b"\0")
                if len(args) >= 7:
                    self.cgroups.add(args[5].decode())

    def gone(self, look_for: float = LOOK_FOR) -> tuple[dict[str, int], float, float]:
        """Poll until no process of the run is left: (leftovers by kind, seconds from the agent's
        exit until the job's processes were gone, until the watchdog was gone too)."""
        assert self.ended_at is not None
        job_gone = None
        while True:
            left = _scan(self.marker)
            now = time.monotonic()
            job = {pid: cmd for pid, cmd in left.items() if not _is_watchdog(cmd)}
            if job_gone is None and not job:
                job_gone = now - self.ended_at
            if not left or now - self.ended_at > look_for:
                kinds: dict[str, int] = {}
                for cmd in left.values():
                    kinds[_kind(cmd, self.marker)] = kinds.get(_kind(cmd, self.marker), 0) + 1
                return kinds, job_gone if job_gone is not None else float("inf"), now - self.ended_at
            time.sleep(0.01)

    def leftover_cgroups(self) -> list[str]:
        return sorted(c for c in self.cgroups if os.path.isdir(c))

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        _kill_marked(self.marker)
        for directory in self.leftover_cgroups():
            _remove_cgroup(directory)


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


def _report(case: str, run: Run, pids: list[int], look_for: float = LOOK_FOR) -> tuple[dict[str, int], float]:
    """Wait for the run's processes to be gone; print the FIGURE line; (leftovers, job_gone_s)."""
    left, job_gone, all_gone = run.gone(look_for)
    by_kind = ",".join(f"{k}:{n}" for k, n in sorted(left.items())) or "none"
    containment = "cgroup" if run.cgroups else "subreaper" if run.containment in ("auto", "subreaper") else "none"
    print(f"\nFIGURE case={case} containment={containment} recorded={len(pids)} "
          f"leftovers={sum(left.values())} by_kind={by_kind} job_gone_s={job_gone:.3f} "
          f"watchdog_gone_s={all_gone:.3f}")
    return left, job_gone


def _assert_contained(run: Run, left: dict[str, int], job_gone: float, what: str) -> None:
    assert not left, f"processes outlived {what}: {left}\n{run.stderr}"
    assert job_gone < GONE_WITHIN, f"the job's processes took {job_gone:.2f}s to go after {what}"
    assert not run.leftover_cgroups(), f"the job's cgroup outlived {what}"


def _assert_cgroup_used(run: Run) -> None:
    if CGROUP:
        assert run.cgroups, f"the workers were not in a job cgroup: {run.worker_cgroups()}"
        assert all(path.endswith("/workers") for path in run.worker_cgroups()), run.worker_cgroups()


# -- the job's end, every way ----------------------------------------------------------------------


def test_success_leaves_no_descendant(family):
    run = family("success")
    stderr = run.finish()
    assert run.proc.returncode == 0, stderr
    pids = run.families()
    _assert_cgroup_used(run)
    left, job_gone = _report("success", run, pids)
    _assert_contained(run, left, job_gone, "a successful job")
    assert not [p for p in pids if _alive(p)]


def test_failure_leaves_no_descendant(family):
    run = family("failure", "--max-restarts", "0")
    stderr = run.finish()
    assert run.proc.returncode == 1, stderr
    pids = run.families()
    left, job_gone = _report("failure", run, pids)
    _assert_contained(run, left, job_gone, "a failed job")


def test_restart_kills_the_old_groups_descendants_before_the_new_group(family):
    run = family("restart", "--max-restarts", "1")
    stderr = run.finish()
    assert run.proc.returncode == 0, stderr
    old = run.families(0)
    stale = " ".join((run.out / f"stale.{rank}").read_text() for rank in (0, 1)).split()
    assert not stale, f"the failed group's processes were alive when its replacement started: {stale}"
    left, job_gone = _report("restart", run, old)
    _assert_contained(run, left, job_gone, "a restarted job")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_leaves_no_descendant(family, signum):
    run = family("wait")
    pids = run.families()
    assert all(_alive(pid) for pid in pids)
    run.proc.send_signal(signum)
    stderr = run.finish()
    assert run.proc.returncode == 128 + signum, stderr
    left, job_gone = _report(signal.Signals(signum).name, run, pids)
    _assert_contained(run, left, job_gone, signal.Signals(signum).name)


def _await_adoption(run: Run) -> None:
    """Without a cgroup: wait until the agent has registered the orphans it adopted (both
    double-forked daemons of each worker) with the watchdog; the run must log at DEBUG."""
    if not CGROUP:
        run.wait_for_log("adopted orphan pid", 4)


def test_sigkill_of_agent_leaves_no_descendant(family):
    run = family("wait", env={"LOGLEVEL": "DEBUG"})
    pids = run.families()
    assert all(_alive(pid) for pid in pids)
    _await_adoption(run)
    run.kill()
    left, job_gone = _report("SIGKILL", run, pids)
    _assert_contained(run, left, job_gone, "the SIGKILLed agent")


def test_preloaded_workers_leave_no_descendant(family):
    run = family("success", "--preload", "json")
    stderr = run.finish()
    assert run.proc.returncode == 0, stderr
    assert "not preloading" not in stderr, stderr
    pids = run.families()
    _assert_cgroup_used(run)
    left, job_gone = _report("preload-success", run, pids)
    _assert_contained(run, left, job_gone, "a successful job with --preload")


def test_sigkill_at_random_moments_of_start_up(family):
    """20 SIGKILLs of the agent: every other one once the workers have started all their children
    (then 0-0.2 s later), the others at a random moment of the start-up before that."""
    rng = random.Random(20261123)
    startup: list[float] = []
    results = []
    for iteration in range(20):
        run = family("wait", name=f"out{iteration}")
        started = time.monotonic()
        if iteration % 2 == 0:
            run.families()
            startup.append(time.monotonic() - started)
            time.sleep(rng.uniform(0.0, 0.2))
        else:
            time.sleep(rng.uniform(0.0, statistics.median(startup) if startup else 1.0))
        families = len(run.recorded())
        delay = time.monotonic() - started
        run.kill()
        # Without a cgroup, a leftover of the documented gap is never going to go: do not wait long.
        left, job_gone = _report(f"sigkill-start-{iteration}", run, [], LOOK_FOR if CGROUP else 3.0)
        results.append((round(delay, 3), families, left, job_gone, run.leftover_cgroups()))
        run.cleanup()
    for delay, families, left, job_gone, cgroups in results:
        print(f"\nFIGURE case=sigkill-start delay_s={delay:.3f} families_recorded={families} "
              f"leftovers={sum(left.values())} job_gone_s={job_gone:.3f} cgroups_left={len(cgroups)}")
    assert sum(families == 2 for _, families, _, _, _ in results) >= 10, results
    assert all(set(left) <= SIGKILL_GAP and not cgroups for _, _, left, _, cgroups in results), results
    if CGROUP:
        assert all(job_gone < GONE_WITHIN for _, _, _, job_gone, _ in results), results


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_second_signal_skips_the_grace_period(family, signum):
    run = family("wait", "--shutdown-timeout", "300", env={"IGNORE_SIGNALS": "1", "LOGLEVEL": "INFO"})
    pids = run.families()
    run.proc.send_signal(signum)
    # The workers ignore it: once the agent has signalled them, it waits out the grace period.
    run.wait_for_log("stopping 2 worker(s)", 1)
    assert run.proc.poll() is None
    started = time.monotonic()
    run.proc.send_signal(signum)
    stderr = run.finish(timeout=120)
    elapsed = time.monotonic() - started
    name = signal.Signals(signum).name
    assert run.proc.returncode == 128 + signum, stderr
    assert "killing it now" in stderr
    # Far below the 300 s grace period, with room for a loaded machine.
    assert elapsed < 100
    left, job_gone = _report(f"second-{name}", run, pids)
    print(f"FIGURE case=second-{name} exit_after_second_signal_s={elapsed:.3f}")
    _assert_contained(run, left, job_gone, f"a second {name}")


def test_concurrent_jobs_do_not_kill_each_others_processes(family):
    bystander = family("wait", name="bystander")
    theirs = bystander.families()
    # Another job that succeeds (its stop-time sweep), then one whose agent is SIGKILLed (its watchdog).
    done = family("success", name="done")
    stderr = done.finish()
    assert done.proc.returncode == 0, stderr
    assert not done.gone()[0]
    killed = family("wait", name="killed", env={"LOGLEVEL": "DEBUG"})
    killed.families()
    _await_adoption(killed)
    killed.kill()
    assert not killed.gone()[0]
    assert all(_alive(pid) for pid in theirs), [pid for pid in theirs if not _alive(pid)]
    assert bystander.proc.poll() is None
    bystander.proc.send_signal(signal.SIGTERM)
    bystander.finish()
    assert not bystander.gone()[0]


# -- the fallback: a child subreaper ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["success", "SIGTERM", "SIGKILL"])
def test_subreaper_fallback_leaves_no_descendant(family, how):
    """``LAUNCHER_CONTAINMENT=subreaper``: what runs where no cgroup is writable."""
    run = family("success" if how == "success" else "wait",
                 env={"LAUNCHER_CONTAINMENT": "subreaper", "LOGLEVEL": "DEBUG"})
    if how == "success":
        run.finish()
        assert run.proc.returncode == 0, run.stderr
    pids = run.families()
    assert not run.cgroups, "LAUNCHER_CONTAINMENT=subreaper still used a cgroup"
    assert "containment: subreaper" in run.stderr
    if how == "SIGTERM":
        run.proc.send_signal(signal.SIGTERM)
        run.finish()
        assert run.proc.returncode == 128 + signal.SIGTERM, run.stderr
    elif how == "SIGKILL":
        # Both double-forked daemons of each worker are orphans the agent adopted: once it has
        # registered them with the watchdog (it says so), a SIGKILL of the agent leaves nothing.
        # The gap (documented): an orphan adopted within the last poll before the SIGKILL.
        run.wait_for_log("adopted orphan pid", 4)
        run.kill()
    left, job_gone = _report(f"subreaper-{how}", run, pids)
    _assert_contained(run, left, job_gone, f"{how} (subreaper fallback)")


# -- the Python API ----------------------------------------------------------------------------------


def _family_function(script: str, out: str, marker: str) -> None:
    """A function worker that does what FAMILY does (the Python API with a callable)."""
    import runpy

    sys.argv = [script, out, "success", marker]
    with contextlib.suppress(SystemExit):
        runpy.run_path(script, run_name="__main__")


@pytest.mark.parametrize("entry", ["command", "function"])
def test_api_never_moves_the_callers_process_nor_kills_its_children(write_script, tmp_path, entry):
    """``launch()`` runs the agent in the caller's process: that process stays in its cgroup and
    its own children (here one in a session of its own, without the job's environment) live on,
    while the workers' descendants, moved into the job's cgroup, end with the job."""
    from launcher import LaunchConfig, launch

    script = write_script("family.py", FAMILY)
    marker = f"LIFETIME_TEST_{uuid.uuid4().hex}"
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                            env={"PATH": os.environ.get("PATH", os.defpath)})
    before = Path("/proc/self/cgroup").read_text()
    out = tmp_path / "out"
    out.mkdir()
    try:
        if entry == "command":
            launch(LaunchConfig(nproc_per_node=2), sys.executable)("-u", script, str(out), "success", marker)
        else:
            launch(LaunchConfig(nproc_per_node=2), _family_function)(script, str(out), marker)
        ended = time.monotonic()
        assert Path("/proc/self/cgroup").read_text() == before
        assert _alive(mine.pid), "the job's end killed a child of the caller's own"
        cgroups = [(out / n).read_text().split("\n")[1] for n in os.listdir(out)]
        assert len(cgroups) == 2
        jobs = {_job_cgroup(c) for c in cgroups}
        if not CGROUP:
            pytest.skip("no writable cgroup: the API's workers are contained by token and session only")
        assert None not in jobs, cgroups
        left, job_gone, _ = _gone_after(marker, since=ended)
        print(f"\nFIGURE case=api-{entry} leftovers={len(left)} job_gone_s={job_gone:.3f}")
        assert not left, left
        assert not [j for j in jobs if j is not None and os.path.isdir(j)]
    finally:
        mine.kill()
        mine.wait()
        _kill_marked(marker)


def test_an_api_command_worker_is_in_the_jobs_cgroup_before_its_first_instruction(tmp_path):
    """The Python API's command workers move themselves into the job's cgroup before their exec:
    what a worker does first (here: read its cgroup, or fork a child) is already inside."""
    from launcher import LaunchConfig, launch

    if not CGROUP:
        pytest.skip("no writable cgroup: the API's workers are contained by token and session only")
    out = tmp_path / "out"
    out.mkdir()
    launch(LaunchConfig(nproc_per_node=2), "/bin/sh")("-c", f'cat /proc/$$/cgroup > {out}/"$LOCAL_RANK"')
    cgroups = [next(line[3:] for line in (out / n).read_text().splitlines() if line.startswith("0::"))
               for n in sorted(os.listdir(out))]
    assert len(cgroups) == 2 and None not in {_job_cgroup(c) for c in cgroups}, cgroups


# -- pieces -----------------------------------------------------------------------------------------


def test_job_processes_matches_only_the_token(tmp_path):
    from launcher.containment._watchdog_main import job_processes

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


MOUNTINFO = """\
22 1 0:21 / /proc rw,nosuid - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / {unified} rw,relatime shared:9 - cgroup2 cgroup2 rw
42 31 0:38 /job {nested} rw,relatime - cgroup2 cgroup2 rw
"""


def test_cgroup2_mount_found_from_mountinfo(tmp_path):
    unified = tmp_path / "with space" / "unified"
    nested = tmp_path / "nested"
    (unified / "a" / "b").mkdir(parents=True)
    (nested / "c").mkdir(parents=True)
    text = MOUNTINFO.format(unified=str(unified).replace(" ", "\\040"), nested=nested)
    assert cgroup2_mounts(text) == [("/", str(unified)), ("/job", str(nested))]
    assert cgroup2_directory(text, "1:cpu:/\n0::/a/b\n") == str(unified / "a" / "b")
    assert cgroup2_directory(text, "0::/\n") == str(unified)
    assert cgroup2_directory(text, "0::/missing\n") is None
    assert cgroup2_directory(text, "4:memory:/x\n") is None  # cgroup v1 only
    # A mount whose root is /job shows /job/c as c (the first mount lacks it).
    text = MOUNTINFO.format(unified=tmp_path / "none", nested=nested)
    assert cgroup2_directory(text, "0::/job/c\n") == str(nested / "c")
    assert cgroup2_directory(text, "0::/jobs\n") is None


def test_containment_mode_variable(monkeypatch, caplog):
    for value, mode in [("", "auto"), ("subreaper", "subreaper"), (" OFF ", "off"), ("auto", "auto")]:
        monkeypatch.setenv("LAUNCHER_CONTAINMENT", value)
        assert requested_mode() == mode
    monkeypatch.setenv("LAUNCHER_CONTAINMENT", "bogus")
    assert requested_mode() == "auto"
    assert "LAUNCHER_CONTAINMENT=bogus" in caplog.text


# -- refused input ---------------------------------------------------------------------------------


def test_refused_input_leaves_no_watchdog(tmp_path):
    """The command line spawns the watchdog as soon as its flags parse (its interpreter boots while
    the plan is built): input refused after that ends it before the launcher exits."""
    marker = f"refused-{uuid.uuid4().hex}"
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('a worker started')\n")
    # The flags parse; the value is refused by the plan, after the watchdog was spawned. stderr
    # goes to a file: a pipe would not end before every holder of it (the watchdog) had exited.
    with open(tmp_path / "stderr", "w+") as stderr:
        code = subprocess.run([*LAUNCHER, "--standalone", "--rdzv-conf", "timeout=-1", str(script)],
                              env=launcher_env({"SURVIVOR_MARKER": marker}), stdout=subprocess.DEVNULL,
                              stderr=stderr, timeout=60).returncode
        left = _scan(marker)
        stderr.seek(0)
        message = stderr.read()
    assert code == 2, message
    assert "--rdzv-conf timeout must be" in message, message
    assert left == {}, f"processes of the refused launch outlived it: {left}"
