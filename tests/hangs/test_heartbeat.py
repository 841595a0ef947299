"""launcher.heartbeat() and launcher.quiet() in real processes, against a real heartbeat file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
from launcher.hangs.heartbeat import HEARTBEAT_FILE_ENV, HEARTBEAT_SLOT_ENV, SLOT_SIZE, quiet
from launcher.hangs.watch import HangWatch, HeartbeatTable

from tests.conftest import launcher_env


def run_python(source: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], env=launcher_env(env),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_outside_launcher_it_is_a_no_op_that_imports_nothing_heavy():
    out = run_python(
        """
        import json, sys
        import launcher
        launcher.heartbeat()
        with launcher.quiet("checkpoint", timeout=5):
            launcher.heartbeat()
        heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("launcher.agent", "launcher.api",
                       "launcher.plugins", "launcher.store")))
        print(json.dumps(heavy))
        """
    )
    assert json.loads(out) == []


def test_a_worker_beats_into_its_slot_and_marks_quiet_sections(tmp_path):
    table = HeartbeatTable(str(tmp_path / "beats"), 3)
    try:
        before = time.monotonic()
        out = run_python(
            """
            import time
            import launcher
            from launcher.hangs.heartbeat import read_slot, _state
            launcher.heartbeat()
            from launcher.hangs import heartbeat as hb
            page, offset = hb._state
            beat, *_ = read_slot(page, 2)
            with launcher.quiet("checkpoint", timeout=600):
                _, deadline, started, name = read_slot(page, 2)
                print(name, round(deadline - started))
            after, deadline, _, name = read_slot(page, 2)
            print(repr(name), deadline, after >= beat)
            """,
            {HEARTBEAT_FILE_ENV: table.path, HEARTBEAT_SLOT_ENV: "2"},
        )
        assert out.splitlines() == ["checkpoint 600", "'' 0.0 True"]
        beat, deadline, _, name = table.read(2)
        assert beat >= before and deadline == 0.0 and name == ""
        assert table.read(0)[0] == 0.0 and table.read(1)[0] == 0.0  # other slots untouched
    finally:
        table.close()


def test_a_forked_child_does_not_beat_for_its_rank(tmp_path):
    table = HeartbeatTable(str(tmp_path / "beats"), 1)
    try:
        out = run_python(
            """
            import os, time
            import launcher
            from launcher.hangs import heartbeat as hb
            launcher.heartbeat()
            first = hb.read_slot(hb._state[0], 0)[0]
            pid = os.fork()
            if pid == 0:
                time.sleep(0.01)
                launcher.heartbeat()
                os._exit(0)
            os.waitpid(pid, 0)
            print(hb.read_slot(hb._state[0], 0)[0] == first)
            """,
            {HEARTBEAT_FILE_ENV: table.path, HEARTBEAT_SLOT_ENV: "0"},
        )
        assert out.strip() == "True"
    finally:
        table.close()


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "10"])
def test_quiet_needs_a_positive_finite_timeout(timeout):
    with pytest.raises(ValueError, match="positive number"):
        quiet("eval", timeout=timeout)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_watch_rules(tmp_path):
    """Never beat: not watched; stale beat: hung; quiet section: its own timeout; output mode."""
    from launcher.hangs.heartbeat import _BEAT, _QUIET, _QUIET_OFFSET, SLOT_SIZE

    path = str(tmp_path / "beats")
    table = HeartbeatTable(path, 4)
    clock = Clock()
    with open(path, "r+b") as handle:
        import mmap

        page = mmap.mmap(handle.fileno(), 4 * SLOT_SIZE)
    try:
        _BEAT.pack_into(page, 1 * SLOT_SIZE, 990.0)  # rank 1: 10 s ago
        _BEAT.pack_into(page, 2 * SLOT_SIZE, 999.0)  # rank 2: 1 s ago
        _BEAT.pack_into(page, 3 * SLOT_SIZE, 900.0)  # rank 3: long ago, but in a quiet section
        _QUIET.pack_into(page, 3 * SLOT_SIZE + _QUIET_OFFSET, 1100.0, 950.0, b"checkpoint")
        watch = HangWatch(table, 5.0, clock=clock)
        states = watch.progress(learn=True)  # the monitor's check (it records the quiet sections seen)
        # Ranks 1 and 2 went silent after rank 3 entered its quiet section: they may be waiting
        # for it (in a collective), and their silence counts only outside it.
        assert [s.hung for s in states] == [False, False, False, False]
        assert states[0].age is None and states[1].age == 10.0
        assert states[3].quiet == "checkpoint"
        clock.now = 1101.0
        assert [s.local_rank for s in watch.progress(learn=True) if s.hung] == [3]  # past its own timeout
        assert "quiet section 'checkpoint'" in watch.progress()[3].reason
        clock.now = 1105.5  # 5.5 s after rank 3's section should have ended
        hung = watch.hung()
        assert [s.local_rank for s in hung] == [1, 2, 3]
        assert hung[0].reason == ("no heartbeat for 115.5 s, 110.0 s of it waiting while another rank was in a "
                                  "quiet section (timeout 5 s)"), hung[0].reason
        # Without a quiet section, silence is silence.
        _QUIET.pack_into(page, 3 * SLOT_SIZE + _QUIET_OFFSET, 0.0, 0.0, b"")
        clock.now = 1000.0
        states = HangWatch(table, 5.0, clock=clock).progress()
        assert [s.hung for s in states] == [False, True, False, True]
        assert states[1].reason == "no heartbeat for 10.0 s (timeout 5 s)"
        # Output mode: a line counts as progress, and a rank that only prints is watched.
        clock.now = 1000.0
        watch = HangWatch(table, 5.0, output=True, clock=clock)
        watch.output_seen(1)()
        clock.now = 1004.0
        watch.output_seen(0)()
        clock.now = 1006.0
        # Rank 2 beat last at 999; rank 3, at 900, is no longer in its quiet section.
        assert [s.local_rank for s in watch.hung()] == [1, 2, 3]
        page.close()
    finally:
        table.close()


def test_a_rank_told_to_beat_that_never_does_is_reported_not_judged(tmp_path):
    """Before its first beat a rank is never hung, but how long it has gone without one is known."""
    from launcher.hangs.heartbeat import _BEAT, SLOT_SIZE

    path = str(tmp_path / "beats")
    table = HeartbeatTable(path, 2)
    clock = Clock()
    with open(path, "r+b") as handle:
        import mmap

        page = mmap.mmap(handle.fileno(), 2 * SLOT_SIZE)
    try:
        watch = HangWatch(table, 5.0, clock=clock)
        assert [s.waiting for s in watch.progress()] == [None, None]  # not started: nothing to count from
        watch.started(0)
        watch.started(1)
        clock.now += 3600.0  # far past the timeout: still not hung
        states = watch.progress()
        assert [(s.hung, s.waiting) for s in states] == [(False, 3600.0), (False, 3600.0)]
        assert states[0].describe() == "no heartbeat yet after 3600 s"
        _BEAT.pack_into(page, SLOT_SIZE, clock.now - 0.5)  # rank 1 beats: watched from now on
        states = watch.progress()
        assert states[1].waiting is None and states[1].describe() == "last heartbeat 0.5 s ago"
        assert states[0].waiting == 3600.0
        page.close()
    finally:
        table.close()


def test_a_beat_that_goes_nowhere_says_why_once_and_an_unmapped_slot_is_tried_again(tmp_path):
    """A process told to beat whose pid record is not its own nor a parent's, or whose slot cannot be
    mapped, says so on stderr (once); a child of the worker stays silent; a missing file is retried."""
    path = tmp_path / "beats"
    source = """
        import os, sys
        import launcher
        from launcher.hangs import heartbeat as hb
        hb.RETRY_INTERVAL = 0.0  # the next call tries again at once
        for _ in range(3):
            launcher.heartbeat()
        print("mapped" if hb._state else "unmapped")
        if sys.argv[1:] == ["create"]:
            with open(os.environ["LAUNCHER_HEARTBEAT_FILE"], "wb") as handle:
                handle.write(bytes(hb.SLOT_SIZE))
            launcher.heartbeat()
            print("mapped" if hb._state else "unmapped")
        if sys.argv[1:] == ["child"]:
            pid = os.fork()
            if pid == 0:
                launcher.heartbeat()
                os._exit(0 if not hb._state else 1)
            print("child", os.waitpid(pid, 0)[1])
        """

    def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(source), *args], env=launcher_env(env),
                              capture_output=True, text=True, timeout=60)

    beats = {HEARTBEAT_FILE_ENV: str(path), HEARTBEAT_SLOT_ENV: "0"}
    # Not its own pid, nor a parent's: one line naming the variable.
    stranger = run({**beats, "LAUNCHER_HEARTBEAT_PID": "999999999"})
    assert stranger.stdout.split() == ["unmapped"], stranger
    lines = stranger.stderr.splitlines()
    assert len(lines) == 1 and "LAUNCHER_HEARTBEAT_PID='999999999'" in lines[0] and "does nothing" in lines[0], lines
    # The file is missing at first: said once, tried again at each call, mapped once it exists.
    late = run(beats, "create")
    assert late.stdout.split() == ["unmapped", "mapped"], late
    assert len(late.stderr.splitlines()) == 1 and "cannot map slot 0" in late.stderr, late
    assert path.read_bytes() != bytes(SLOT_SIZE)
    # A forked child of the worker (a data-loader worker) does nothing and says nothing.
    child = run(beats, "child")
    assert child.stdout.split() == ["mapped", "child", "0"] and child.stderr == "", child
