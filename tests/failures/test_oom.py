"""OomWatch: cgroup counters (v1 and v2) and kernel-log records, faked and, where allowed, real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from launcher.failures import FailureReport, OomWatch, WorkerFailure
from launcher.failures.oom import CgroupCounter, find_cgroup_counters

from ..conftest import unwrapped

V2_EVENTS = "low 0\nhigh 0\nmax 3\noom {n}\noom_kill {n}\noom_group_kill 0\n"
V1_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"


def test_find_counters_v2_and_v1(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "job.slice" / "job-1").mkdir(parents=True)
    (root / "job.slice" / "job-1" / "memory.events").write_text(V2_EVENTS.format(n=0))
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/job.slice/job-1\n")
    assert find_cgroup_counters(str(proc), str(root)) == [
        CgroupCounter(f"{root}/job.slice/job-1/memory.events")
    ]

    (root / "memory" / "docker" / "abc").mkdir(parents=True)
    (root / "memory" / "docker" / "abc" / "memory.oom_control").write_text(V1_CONTROL.format(n=2))
    proc.write_text("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    counters = find_cgroup_counters(str(proc), str(root))
    assert counters == [CgroupCounter(f"{root}/memory/docker/abc/memory.oom_control")]
    assert counters[0].read() == 2


def test_find_counters_falls_back_to_the_mount_root(tmp_path: Path) -> None:
    # A container without a cgroup namespace: /proc/self/cgroup shows the host's path, and the
    # container's own cgroup is the root of its mount.
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "memory.events").write_text(V2_EVENTS.format(n=0))
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/kubepods/pod-123/container-9\n")
    assert find_cgroup_counters(str(proc), str(root)) == [CgroupCounter(f"{root}/memory.events")]


def test_find_counters_v2_takes_the_nearest_cgroup_with_memory_events(tmp_path: Path) -> None:
    # The command line's agent runs in a job cgroup below its own, with no controller enabled.
    root = tmp_path / "cgroup"
    (root / "user.slice" / "launcher-abc" / "workers").mkdir(parents=True)
    (root / "user.slice" / "memory.events").write_text(V2_EVENTS.format(n=0))
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/user.slice/launcher-abc/workers\n")
    assert find_cgroup_counters(str(proc), str(root)) == [CgroupCounter(f"{root}/user.slice/memory.events")]


def test_counter_rise_means_likely_oom(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text(V2_EVENTS.format(n=1))
    watch = OomWatch(counters=[CgroupCounter(str(events))], kmsg_path=None)
    watch.snapshot()
    assert not watch.killed_by_oom(1234)
    events.write_text(V2_EVENTS.format(n=2))
    assert watch.killed_by_oom(1234)
    assert "oom_kill rose from 1 to 2" in (watch.evidence(1234) or "")


def test_kernel_log_names_the_victim(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,100,5000,-;Out of memory: Killed process 1111 (python) total-vm:1kB\n")
    with OomWatch(counters=[], kmsg_path=str(kmsg)) as watch:
        assert not watch.killed_by_oom(1111)  # logged before the snapshot: another run's
        with kmsg.open("a") as fp:
            fp.write("4,101,6000,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=2222,uid=0\n")
            fp.write(" SUBSYSTEM=memory\n")
            fp.write("3,102,6001,-;Memory cgroup out of memory: Killed process 2222 (python) total-vm:9kB\n")
        assert watch.killed_by_oom(2222)
        assert not watch.killed_by_oom(3333)
        assert watch.evidence(2222) == (
            "kernel log: Memory cgroup out of memory: Killed process 2222 (python) total-vm:9kB"
        )


def test_unreadable_sources_answer_false(tmp_path: Path) -> None:
    watch = OomWatch(
        counters=[CgroupCounter(str(tmp_path / "absent"))], kmsg_path=str(tmp_path / "absent-kmsg")
    )
    watch.snapshot()
    assert not watch.killed_by_oom(1)
    watch.close()


def _memory_cgroup_dir() -> Path | None:
    """A writable memory cgroup (v1 or v2) of this process, where a child with a limit can be made."""
    if os.geteuid() != 0:
        return None
    for counter in find_cgroup_counters():
        parent = Path(counter.path).parent
        if counter.path.endswith("memory.oom_control") and (parent / "memory.limit_in_bytes").exists():
            return parent
        subtree = parent / "cgroup.subtree_control"
        if (
            counter.path.endswith("memory.events")
            and subtree.exists()
            and "memory" in subtree.read_text().split()
        ):
            return parent
    return None


@pytest.mark.slow
def test_real_oom_kill_is_detected(tmp_path: Path) -> None:
    parent = _memory_cgroup_dir()
    if parent is None:
        pytest.skip("needs root and a memory cgroup where a child cgroup can be created")
    child = parent / f"launcher-oom-test-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup: {exc}")
    try:
        v1 = (child / "memory.limit_in_bytes").exists()
        limit = str(64 * 1024 * 1024)
        if v1:
            (child / "memory.limit_in_bytes").write_text(limit)
            counter = CgroupCounter(str(child / "memory.oom_control"))
        else:
            (child / "memory.max").write_text(limit)
            if (child / "memory.swap.max").exists():
                (child / "memory.swap.max").write_text("0")
            counter = CgroupCounter(str(child / "memory.events"))
        watch = OomWatch(counters=[counter])
        watch.snapshot()
        hog = subprocess.Popen(
            [
                sys.executable,
                "-c",
                # Waits until it is in the cgroup, then touches every page of 512 MB.
                "import sys; sys.stdin.readline(); b = bytearray(512 << 20); b[::4096] = b'x' * (512 << 8)",
            ],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        (child / "cgroup.procs").write_text(str(hog.pid))
        _, err = hog.communicate(b"go\n", timeout=60)
        if hog.returncode != -signal.SIGKILL:
            pytest.skip(f"the memory limit did not lead to an OOM kill here (exit {hog.returncode})")
        assert watch.killed_by_oom(hog.pid)
        failure = WorkerFailure("node", 0, 0, "trainer", hog.pid, None, signal.SIGKILL, 0.0, None, [])
        text = unwrapped(FailureReport.from_failures([failure], oom_watch=watch).render())
        assert "signal SIGKILL (9), likely out of memory" in text
        watch.close()
    finally:
        child.rmdir()
