"""Recovery in place on one node: real workers, real gloo, the example training loop of docs/recovery.md.

One uninterrupted run is the reference; each scenario runs the same deterministic loop with one
failure in its first attempt and must end with exactly the reference's parameters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_launcher

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "recoverable_train.py")
NPROC = 3
#: Generous: the release takes milliseconds; gloo's own timeout (30 minutes) is far above it.
RELEASE_BOUND_S = 15.0


def toy_run(tmp_path: Path, name: str, fail: str = "",
            extra: tuple[str, ...] = ()) -> tuple[Any, dict[int, list[dict[str, Any]]]]:
    """Run the example; its records by rank. The job's events go to ``tmp_path/<name>.events.jsonl``."""
    out = tmp_path / name
    out.mkdir()
    env = {"TOY_OUT": str(out), "TOY_STEPS": "8", "TOY_FAIL": fail,
           "LAUNCHER_EVENTS_FILE": str(tmp_path / f"{name}.events.jsonl")}
    extra = ("--event-log-handler", "jsonl", *extra)
    result = run_launcher(["--standalone", "--nproc-per-node", str(NPROC), "--max-restarts", "2", *extra, EXAMPLE],
                          env=env, timeout=180)
    records = {rank: [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
               for rank in range(NPROC)}
    return result, records


def finals(records: dict[int, list[dict[str, Any]]]) -> dict[int, list[float]]:
    return {rank: [r for r in rows if r["event"] == "final"][-1]["params"] for rank, rows in records.items()}


def pids(records: dict[int, list[dict[str, Any]]], rank: int) -> list[int]:
    """The pid of each call of the training function on ``rank``, in order."""
    return [r["pid"] for r in records[rank] if r["event"] == "start"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[float]]:
    result, records = toy_run(tmp_path_factory.mktemp("reference"), "ref")
    assert result.returncode == 0, result.stderr
    assert "recovering in place" not in result.stderr
    return finals(records)


@pytest.fixture(scope="module")
def raised(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[int, list[dict[str, Any]]], Path]:
    # Rank 2 waits at step 5 until ranks 0 and 1 recorded that they entered that step's all-reduce.
    base = tmp_path_factory.mktemp("raised")
    return (*toy_run(base, "raised", fail="2:5:raise"), base / "raised.events.jsonl")


def test_a_rank_that_raises_recovers_in_place(raised, reference):
    result, records, _ = raised
    assert result.returncode == 0, result.stderr
    assert "local rank 2 (pid" in result.stderr and "raised RuntimeError: rank 2 fails at step 5" in result.stderr
    assert "recovering in place (1 of 2 restarts left)" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "job succeeded on this node; restarts used: 1 in-place recovery, 0 restarts (of --max-restarts 2)" in last
    for rank in range(NPROC):
        calls = pids(records, rank)
        assert len(calls) == 2 and calls[0] == calls[1], (rank, calls)  # called again, in the same process
        starts = [r for r in records[rank] if r["event"] == "start"]
        assert [s["restart"] for s in starts] == [0, 1]
        assert starts[1]["step"] == 5  # resumed from the in-memory checkpoint of step 4
    assert finals(records) == reference


def test_the_events_say_in_place_recovery(raised):
    events = [json.loads(line) for line in raised[2].read_text().splitlines()]
    [restart] = [e["data"] for e in events if e["type"] == "group_restarted"]
    assert restart["mode"] == "in-place recovery" and restart["count"] == 1 and restart["cause"] == "failure"
    assert restart["kept"] == [0, 1, 2] and restart["replaced"] == []
    assert "raised RuntimeError: rank 2 fails at step 5" in restart["reason"]
    started = [e["data"] for e in events if e["type"] == "workers_started"]
    assert [(s["restart_count"], s.get("in_place", False)) for s in started] == [(0, False), (1, True)]
    assert [w["pid"] for w in started[0]["workers"]] == [w["pid"] for w in started[1]["workers"]]
    [succeeded] = [e["data"] for e in events if e["type"] == "job_succeeded"]
    assert succeeded == {"restart_count": 1, "in_place_recoveries": 1}


def test_a_rank_blocked_in_a_collective_is_released(raised):
    _, records, _ = raised
    failed_at = next(r["t"] for r in records[2] if r["event"] == "failing")
    for rank in (0, 1):
        released = [r for r in records[rank] if r["event"] == "released"]
        assert released, f"rank {rank} never was in the step's all-reduce: {records[rank]}"
        waited = released[0]["t"] - failed_at
        assert 0 <= waited < RELEASE_BOUND_S, (rank, waited)


def test_a_killed_rank_is_replaced_and_the_others_keep_their_process(tmp_path, reference):
    result, records = toy_run(tmp_path, "killed", fail="1:5:kill")
    assert result.returncode == 0, result.stderr
    assert "local rank 1 (pid" in result.stderr and "was killed by SIGKILL; recovering in place" in result.stderr
    for rank in (0, 2):
        calls = pids(records, rank)
        assert len(calls) == 2 and calls[0] == calls[1], (rank, calls)
    killed = pids(records, 1)
    assert len(killed) == 2 and killed[0] != killed[1]  # a fresh process in its slot
    fresh = [r for r in records[1] if r["event"] == "start"][1]
    assert fresh["step"] == 5  # it received the checkpoint from a peer that kept one
    assert finals(records) == reference
