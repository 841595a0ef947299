"""Who decides a straggler's exclusion: exactly one node, the lowest group rank not on the
straggler's node, and no node but group rank 1 reads the round's roster to tell."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from launcher.rendezvous.membership import Roster
from launcher.stragglers.exclusion import Exclusion
from launcher.stragglers.verdict import Finding


@dataclass
class _Info:
    round: int
    group_rank: int
    group_world_size: int
    participants: Any


@dataclass
class _Handler:
    calls: list[tuple[str, bool]] = field(default_factory=list)

    def put_out(self, node: str, reason: str, publish: bool) -> None:
        self.calls.append((node, publish))


def _finding(node: str) -> Finding:
    return Finding(rank=9, node=node, local_rank=1, ratio=1.5, basis="steps", work_share=0.0,
                   others_work_share=0.0, wait_share=0.0, others_wait_share=0.0, step_rate=1.0,
                   others_step_rate=1.5, holds_others=True, window=10.0)


def _decisions(ids: list[str], straggler: str, host_rank: int = 0) -> tuple[list[bool], list[int]]:
    """Each group rank's ``publish``, and how many times each node's roster was read."""
    reads = [0] * len(ids)
    published = []
    for rank in range(len(ids)):

        def load(rank: int = rank) -> list[str]:
            reads[rank] += 1
            return list(ids)

        known = {rank: ids[rank], host_rank: ids[host_rank]}
        info = _Info(3, rank, len(ids), Roster(len(ids), load, known))
        handler = _Handler()
        exclusion = Exclusion(emit=None, say=lambda lines: None)
        exclusion.propose([_finding(straggler)], info)
        exclusion.act(handler, info)
        ((node, publish),) = handler.calls
        assert node == straggler
        published.append(publish)
    return published, reads


def test_exactly_the_lowest_group_rank_off_the_stragglers_node_decides() -> None:
    ids = [f"n{i}" for i in range(6)]
    for straggler, host_rank in itertools.product(ids, (0, 2)):
        published, _ = _decisions(ids, straggler, host_rank)
        expected = next(i for i, node in enumerate(ids) if node != straggler)
        assert published == [rank == expected for rank in range(len(ids))], (straggler, host_rank)


def test_only_group_rank_1_reads_the_roster_and_only_when_rank_0_is_not_the_host() -> None:
    ids = [f"n{i}" for i in range(6)]
    _, reads = _decisions(ids, "n4", host_rank=0)
    assert reads == [0] * 6  # group rank 0's name is known to all (it serves the store)
    _, reads = _decisions(ids, "n4", host_rank=3)
    assert reads == [0, 1, 0, 0, 0, 0]


def test_a_roster_that_cannot_be_read_makes_nobody_decide() -> None:
    def gone() -> list[str]:
        raise OSError("the store is gone")

    info = _Info(0, 1, 4, Roster(4, gone, {1: "n1"}))
    handler = _Handler()
    exclusion = Exclusion(emit=None, say=lambda lines: None)
    exclusion.propose([_finding("n2")], info)
    exclusion.act(handler, info)
    assert handler.calls == [("n2", False)]
