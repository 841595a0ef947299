"""The hang report: parsing real faulthandler dumps, grouping ranks, rendering, JSON."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from launcher.errors import UsageError
from launcher.failures.report import FailureReport, WorkerFailure
from launcher.hangs.report import HangReport, NodeSummary, RankEntry, group_by_stack, rank_ranges
from launcher.hangs.stacks import parse_dump

from tests.conftest import unwrapped


def real_dump() -> str:
    """What faulthandler writes for a process with a main thread and a helper thread."""
    source = """
        import faulthandler, sys, threading, time
        def helper_loop():
            time.sleep(30)
        def deep_inside():
            faulthandler.dump_traceback(all_threads=True)
        threading.Thread(target=helper_loop, daemon=True).start()
        time.sleep(0.2)
        deep_inside()
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
                            timeout=60)
    return result.stderr


def test_parse_a_real_dump_and_find_the_main_thread():
    from launcher.hangs.stacks import RankStacks, stack_summary

    threads = parse_dump(real_dump())
    assert len(threads) == 2
    stacks = RankStacks(0, threads=threads)
    assert stacks.main is not None
    assert [f.function for f in stacks.main.frames] == ["deep_inside", "<module>"]
    helper = next(t for t in threads if t is not stacks.main)
    assert helper.frames[0].function == "helper_loop" and not helper.is_main
    assert stack_summary(stacks) == "deep_inside (<string>:6) <- <module> (<string>:9)"


def test_rank_ranges():
    assert rank_ranges([8, 0, 1, 2, 3, 4, 5, 6, 9, 10, 15, 11, 12, 13, 14]) == "0-6, 8-15"
    assert rank_ranges([7]) == "7"
    assert rank_ranges([0, 2]) == "0, 2"


def entry(rank: int, summary: str, hung: bool = False, age: float = 1.0) -> RankEntry:
    return RankEntry(rank=rank, local_rank=rank % 8, node=f"n{rank // 8}", pid=100 + rank, age=age, hung=hung,
                     summary=summary)


def test_groups_put_hung_ranks_first_then_the_odd_ones_out():
    reduce = "all_reduce (distributed_c10d.py:1) <- train_step (train.py:42)"
    entries = [entry(r, reduce) for r in range(16) if r not in (7, 9)]
    entries += [entry(7, "read (loader.py:88)", hung=True, age=30.0), entry(9, "save (ckpt.py:3)")]
    groups = group_by_stack(entries)
    assert [[e.rank for e in members] for members, _ in groups] == [[7], [9], [r for r in range(16) if r not in (7, 9)]]
    report = HangReport("n0", "rank 7 (local rank 7): no heartbeat for 30.0 s (timeout 10 s)",
                        [NodeSummary("n0", 0, [e for e in entries if e.rank < 8], "/logs/a.txt"),
                         NodeSummary("n1", 1, [e for e in entries if e.rank >= 8])], missing=[2])
    text = report.render()
    assert "\n  rank 7: read (loader.py:88)\n  rank 9: save (ckpt.py:3)\n  ranks 0-6, 8, 10-15: all_reduce" in text
    assert "\n  rank 7 on n0 (local rank 7, pid 107): last heartbeat 30.0 s ago\n" in text
    assert "No answer from node(s) with group rank 2" in text
    assert "Full stacks: /logs/a.txt (on n0)" in text
    # A node's summary survives the store's JSON, without the full stacks.
    node = NodeSummary("n0", 0, [entry(1, "x")])
    node.ranks[0].stacks = {"threads": []}
    import json

    back = NodeSummary.from_dict(json.loads(node.to_bytes()))
    assert back.ranks[0].summary == "x" and back.ranks[0].stacks is None


def test_in_a_collective_hang_the_odd_rank_out_is_named_first_whatever_its_age():
    """Ranks waiting in a collective stop beating with the stuck rank: near-equal ages do not decide."""
    reduce = "all_reduce (distributed_c10d.py:3252) <- wrapper (c10d_logger.py:83) <- step (train.py:9)"
    waiting = [entry(r, reduce, hung=True, age=3.2) for r in (0, 1, 3)]
    for waiter in waiting:
        waiter.collective = True
    stuck = entry(2, "slow_loader (train.py:7) <- step (train.py:8)", hung=True, age=3.0)
    stuck.reason = "no heartbeat for 3.0 s (timeout 3 s)"
    report = HangReport("n0", "rank 0 (local rank 0): no heartbeat for 3.2 s (timeout 3 s)",
                        [NodeSummary("n0", 0, [*waiting, stuck])], tolerance=0.75)
    assert [e.rank for e in report.hung_ranks] == [2, 0, 1, 3]
    assert report.culprit_reason() == "rank 2 (local rank 2): no heartbeat for 3.0 s (timeout 3 s)"
    assert report.to_dict()["hung_ranks"] == [2, 0, 1, 3]
    assert report.render().splitlines()[4].startswith("  rank 2 on n0 (local rank 2")

    # Not in torch.distributed either way: the smallest group of identical stacks comes first.
    for waiter in waiting:
        waiter.collective = False
    assert report.hung_ranks[0].rank == 2
    # A rank silent much longer than the others (beyond the tolerance) still comes first.
    waiting[1].age = 30.0
    assert [e.rank for e in report.hung_ranks] == [1, 0, 3, 2]
    assert [[e.rank for e in members] for members, _ in group_by_stack(report.entries, report.hung_ranks)] == [
        [0, 1, 3], [2]]


def test_a_node_summary_says_which_ranks_are_in_a_collective():
    import json

    from launcher.hangs.stacks import Frame, RankStacks, ThreadStack, in_collective

    inside = RankStacks(0, threads=[ThreadStack("0x1", [
        Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
        Frame("/job/train.py", 9, "<module>")])])
    outside = RankStacks(1, threads=[ThreadStack("0x2", [Frame("/job/train.py", 7, "slow_loader")])])
    assert in_collective(inside) and not in_collective(outside) and not in_collective(None)
    node = NodeSummary("n0", 0, [entry(0, "x")])
    node.ranks[0].collective = True
    assert NodeSummary.from_dict(json.loads(node.to_bytes())).ranks[0].collective


def test_the_failure_report_carries_the_hang_in_text_and_json():
    hang = HangReport("n0", "rank 1 (local rank 1): no heartbeat for 4.0 s (timeout 3 s)",
                      [NodeSummary("n0", 0, [entry(0, "main (a.py:1)"), entry(1, "stuck (a.py:9)", hung=True)])])
    failure = WorkerFailure(node="n0", rank=1, local_rank=1, role="default", pid=101, exitcode=None, signal=15,
                            timestamp=1.0)
    report = FailureReport.from_failures([failure], title="a rank hung; the workers were stopped")
    report.hang = hang.to_dict()
    text = report.render()
    assert "hung ranks : 1" in text and "    rank 1: stuck (a.py:9)" in text and "    rank 0: main (a.py:1)" in text
    # The hung rank was stopped because of the hang, not "after another worker failed".
    assert "asked to stop by the launcher after the hang was detected" in unwrapped(text), text
    assert "another worker failed" not in unwrapped(text), text
    assert report.to_dict()["root_cause"]["explanation"].startswith("asked to stop by the launcher after the hang")
    report.hang = None
    assert "after another worker failed" in unwrapped(report.render())
    report.hang = hang.to_dict()
    again = FailureReport.from_dict(report.to_dict())
    assert again.hang == report.hang and again.hang is not None and again.hang["hung_ranks"] == [1]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "x", "1e999"])
def test_python_api_validates_the_timeout(bad):
    from launcher.config import LaunchConfig

    with pytest.raises(UsageError, match="--hang-timeout"):
        LaunchConfig(hang_timeout=bad)
    assert LaunchConfig(hang_timeout="2.5").hang_timeout == 2.5
    assert LaunchConfig().hang_timeout is None
