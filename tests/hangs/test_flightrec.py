"""The flight-recorder evidence of a hang, over recorded dumps (gloo, recorded by launcher with
torch 2.13) and an NCCL-shaped one: the same parser and analysis for both (tests/hangs/data)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launcher.agent.reporting import blame_order
from launcher.failures.report import FailureReport, ReportedFailure, WorkerFailure
from launcher.hangs import flightrec
from launcher.hangs.report import HangReport, NodeSummary, RankEntry

DATA = Path(__file__).parent / "data"


def records(name: str) -> dict[int, dict]:
    """Each rank's dump in ``data/name``, reduced as a node reduces it (keyed by global rank)."""
    found = {}
    for path in sorted((DATA / name).glob("rank_*.json")):
        rank = int(path.stem.split("_")[1])
        record = flightrec.summarise(json.loads(path.read_text()))
        record["rank"] = rank
        found[rank] = record
    return found


def test_two_gloo_ranks_name_the_one_that_did_not_enter_the_sixth_all_reduce():
    analysis = flightrec.analyse(records("gloo_two_ranks"), world_size=2)
    [verdict] = analysis.verdicts
    assert (verdict.group, verdict.desc, verdict.seq, verdict.op, verdict.sizes) == (
        "0", "default_pg", 6, "gloo:all_reduce", [[4]])
    assert verdict.behind == {1: 5}
    assert verdict.inside == [0]
    assert analysis.blamed == [1]
    assert analysis.lines()[0] == ("process group 0 (default_pg), collective #6 gloo:all_reduce, sizes [[4]]: "
                                   "not entered by rank 1 (last entered #5); rank 0 inside it")


def test_several_groups_blame_the_rank_that_waits_in_none():
    # Ranks 0-1 wait in the default group's #4 for ranks 2-3; rank 3 waits in group "2"'s #4 for
    # rank 2, which waits in nothing: rank 2 is blamed, not rank 3.
    analysis = flightrec.analyse(records("gloo_groups"), world_size=4)
    by_group = {verdict.group: verdict for verdict in analysis.verdicts}
    assert set(by_group) == {"0", "2"}  # group "1" ([0, 1]) finished everything it entered
    assert (by_group["0"].seq, by_group["0"].behind, by_group["0"].inside) == (4, {2: 3, 3: 3}, [0, 1])
    assert (by_group["2"].seq, by_group["2"].op, by_group["2"].behind, by_group["2"].inside) == (
        4, "gloo:broadcast", {2: 3}, [3])
    assert analysis.blamed == [2]


def test_nccl_shaped_records_go_through_the_same_parser():
    dumps = records("nccl_shaped")
    # No launcher_pg_ranks here: the members come from torch's pg_config ("[0, 1]", a string).
    assert dumps[0]["groups"]["0"]["ranks"] == [0, 1]
    # The coalesced op counts once, point-to-point ops not at all.
    assert dumps[1]["groups"]["0"]["entered"] == 6
    assert dumps[0]["groups"]["1"] == {"desc": "tp", "ranks": [0, 1], "entered": 1, "completed": 1,
                                       "op": "nccl:all_gather", "sizes": [[64]]}
    analysis = flightrec.analyse(dumps, world_size=2)
    [verdict] = analysis.verdicts  # the "tp" group finished its only collective
    assert (verdict.seq, verdict.op, verdict.sizes, verdict.behind, verdict.inside) == (
        7, "nccl:all_reduce", [[2048, 2048]], {1: 6}, [0])
    assert analysis.blamed == [1]


def test_a_collective_entered_by_all_with_different_sizes_is_shown_and_blames_none():
    dumps = records("nccl_shaped")
    late = json.loads((DATA / "nccl_shaped" / "rank_0.json").read_text())
    late["entries"][-1]["input_sizes"] = [[1024, 2048]]
    dumps[1] = flightrec.summarise(late)
    analysis = flightrec.analyse(dumps, world_size=2)
    [verdict] = analysis.verdicts
    assert verdict.behind == {} and verdict.inside == [0, 1]
    assert verdict.mismatch == "nccl:all_reduce [[2048, 2048]] on ranks 0; nccl:all_reduce [[1024, 2048]] on ranks 1"
    assert analysis.blamed == []
    assert "  ranks disagree on it: " in "\n".join(analysis.lines())


def test_a_rank_without_a_record_is_said_so_and_never_blamed():
    dumps = records("gloo_two_ranks")
    dumps[1] = flightrec.summarise({"launcher_note": "torch.distributed was never imported"})
    analysis = flightrec.analyse(dumps, world_size=2)
    [verdict] = analysis.verdicts
    assert (verdict.behind, verdict.inside, verdict.unknown) == ({}, [0], [1])
    assert analysis.blamed == []
    assert analysis.lines()[-1] == "no record from rank 1: torch.distributed was never imported"


def _node(name: str, group_rank: int, ranks: dict[int, dict]) -> NodeSummary:
    summary = NodeSummary(name, group_rank)
    for local_rank, (rank, record) in enumerate(sorted(ranks.items())):
        summary.ranks.append(RankEntry(rank=rank, local_rank=local_rank, node=name, pid=100 + rank, age=3.0,
                                       hung=True, summary=f"stack of {rank}", reason="no heartbeat for 3.0 s"))
        summary.collectives[str(rank)] = record
    return summary


def test_across_nodes_the_evidence_travels_in_each_node_summary_and_is_compared_where_joined():
    dumps = records("gloo_groups")
    sent = [_node("node-a", 0, {0: dumps[0], 1: dumps[1]}), _node("node-b", 1, {2: dumps[2], 3: dumps[3]})]
    # As the store carries them: the compact form, read back.
    nodes = [NodeSummary.from_dict(json.loads(node.to_bytes())) for node in sent]
    evidence = {int(rank): record for node in nodes for rank, record in node.collectives.items()}
    report = HangReport(detected_by="node-a", reason="rank 0 stopped", nodes=nodes,
                        collectives=flightrec.analyse(evidence, 4))
    assert report.blamed_ranks == [2]
    assert [entry.rank for entry in report.hung_ranks][0] == 2
    assert report.culprit_reason() == ("rank 2 (local rank 0): no heartbeat for 3.0 s; did not enter collective #4 "
                                       "gloo:all_reduce, sizes [[2,3]] of process group 0 (default_pg)")
    text = report.render()
    assert "Collectives (flight recorder, per process group):\n  process group 0 (default_pg), collective #4" in text
    data = report.to_dict()
    assert data["blamed_ranks"] == [2]
    assert flightrec.Analysis.from_dict(data["collectives"]).lines() == report.collectives.lines()


def test_a_node_that_did_not_answer_leaves_its_ranks_unknown():
    dumps = records("gloo_groups")
    analysis = flightrec.analyse({0: dumps[0], 1: dumps[1]}, world_size=4)
    [verdict] = analysis.verdicts
    assert (verdict.group, verdict.behind, verdict.inside, verdict.unknown) == ("0", {}, [0, 1], [2, 3])
    assert analysis.blamed == []


def test_without_records_the_likeliest_hung_rank_is_blamed():
    entries = [RankEntry(rank=0, local_rank=0, node="n", pid=1, age=3.0, hung=True, summary="a", collective=True),
               RankEntry(rank=1, local_rank=1, node="n", pid=2, age=3.0, hung=True, summary="b")]
    report = HangReport(detected_by="n", reason="r", nodes=[NodeSummary("n", 0, entries)])
    assert report.blamed_ranks == [1]
    assert report.to_dict()["collectives"] is None


def _stopped(rank: int, when: float) -> ReportedFailure:
    return ReportedFailure(WorkerFailure(rank=rank, local_rank=rank, role="default", pid=100 + rank, exitcode=None,
                                         signal=15, timestamp=when, node="n"))


def test_the_root_cause_is_the_blamed_rank_not_the_first_the_launcher_stopped():
    failures = [_stopped(0, 10.0), _stopped(1, 10.5)]
    assert [f.failure.rank for f in sorted(failures, key=lambda f: blame_order(f, []))] == [0, 1]
    ordered = sorted(failures, key=lambda f: blame_order(f, [1]))
    assert [f.failure.rank for f in ordered] == [1, 0]
    report = FailureReport(ordered, hang={"blamed_ranks": [1], "hung_ranks": [1, 0], "groups": []})
    text = report.render()
    assert "  rank       : 1 (local rank 1" in text
    assert "the hang is blamed on this rank (see the hang above)" in text


def test_the_buffer_is_set_only_where_the_user_set_none(tmp_path):
    env: dict[str, str] = {}
    assert flightrec.arm_environment(env, str(tmp_path / "p"), str(tmp_path / "o"))
    assert env[flightrec.BUFFER_ENV] == str(flightrec.DEFAULT_BUFFER)
    assert stat.S_ISFIFO(os.stat(tmp_path / "p").st_mode)
    for name in (flightrec.BUFFER_ENV, flightrec.LEGACY_BUFFER_ENV):
        env = {name: "50"}
        flightrec.arm_environment(env, str(tmp_path / "q"), str(tmp_path / "o"))
        assert env == {name: "50", "LAUNCHER_FR_REQUEST": str(tmp_path / "q"), "LAUNCHER_FR_FILE": str(tmp_path / "o")}


def test_a_worker_that_serves_no_dumps_is_said_so_at_once(tmp_path):
    env: dict[str, str] = {}
    flightrec.arm_environment(env, str(tmp_path / "p"), str(tmp_path / "o"))
    found = flightrec.request([(0, str(tmp_path / "p"), str(tmp_path / "o"))], timeout=5)
    assert "serves no flight-recorder dumps" in found[0]["launcher_note"]


def test_a_group_nobody_waits_in_is_not_reported_even_when_a_ring_buffer_lost_its_entries():
    dumps = records("gloo_groups")
    # Rank 1's buffer wrapped past every entry of group "1" ([0, 1]); rank 0 completed them all.
    del dumps[1]["groups"]["1"]
    analysis = flightrec.analyse(dumps, world_size=4)
    assert {verdict.group for verdict in analysis.verdicts} == {"0", "2"}
    assert analysis.blamed == [2]


@pytest.mark.parametrize("value", ["[0, 1]", [1, 0]])
def test_members_read_as_torch_writes_them(value):
    assert flightrec._members(value) == [0, 1]


MOVING_WORKER = """
import sys
from launcher.hangs import flightrec_worker
for line in sys.stdin:
    request, out = line.split()
    flightrec_worker.serve({"LAUNCHER_FR_REQUEST": request, "LAUNCHER_FR_FILE": out})
    print("serving", request, flush=True)
"""


def test_the_worker_thread_answers_and_follows_a_new_attempts_pipe(tmp_path):
    # A worker that recovers in place is given the next attempt's pipe: its one thread moves there.
    pipes = [(str(tmp_path / f"p{n}"), str(tmp_path / f"o{n}")) for n in (0, 1)]
    for pipe, out in pipes:
        flightrec.arm_environment({}, pipe, out)
    worker = subprocess.Popen([sys.executable, "-c", MOVING_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        for number, (pipe, out) in enumerate(pipes):
            worker.stdin.write(f"{pipe} {out}\n")
            worker.stdin.flush()
            assert worker.stdout.readline().split() == ["serving", pipe]
            # The thread opens its pipe soon after it starts: ask until it does (no reader yet: ENXIO).
            deadline = time.monotonic() + 60
            while True:
                found = flightrec.request([(number, pipe, out)], timeout=30)[number]
                if "serves no" not in found["launcher_note"] or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            assert found == {"launcher_note": "torch.distributed was never imported"}
        # The old pipe has no reader any more.
        assert "serves no" in flightrec.request([(0, *pipes[0])], timeout=30)[0]["launcher_note"]
    finally:
        worker.kill()
        worker.wait()
