"""The verdict on synthetic numbers: who is named, when, and that noise names nobody."""

from __future__ import annotations

import random

import pytest
from launcher.stragglers.cluster import decode, encode, gather
from launcher.stragglers.settings import DEFAULT_THRESHOLD
from launcher.stragglers.verdict import (
    MIN_EVENTS,
    MIN_INTERVALS,
    RankSample,
    StragglerTracker,
    judge,
    select_window,
    window,
)


def simulate(rnd: random.Random, *, ranks: int = 8, compute: float = 0.1, noise: float = 0.1, seconds: float = 5.0,
             slow: dict[int, float] | None = None, overhead: float = 0.01, transfer: float = 0.003,
             loader: dict[int, float] | None = None) -> list[RankSample]:
    """One interval of a data-parallel job: every step, each rank works (compute with noise, times its
    slowdown, plus an overhead), then all meet in an all-reduce that ends when the last arrives."""
    slow, loader = slow or {}, loader or {}
    work = [0.0] * ranks
    wait = [0.0] * ranks
    span, steps = 0.0, 0
    while span < seconds:
        times = [compute * (1 + rnd.uniform(-noise, noise)) * slow.get(r, 1.0) + overhead + loader.get(r, 0.0)
                 for r in range(ranks)]
        last = max(times)
        for r in range(ranks):
            work[r] += times[r]
            wait[r] += last - times[r] + transfer
        span += last + transfer
        steps += 1
    return [RankSample(r, f"node{r // 4}", r % 4, span, wait[r], steps, 0) for r in range(ranks)]


def run(intervals: list[list[RankSample]], threshold: float = DEFAULT_THRESHOLD) -> tuple[StragglerTracker, list]:
    """Feed ``intervals`` through the window and the tracker as the monitor does; the changes."""
    tracker = StragglerTracker(threshold)
    history: dict[int, list[RankSample]] = {}
    changes = []
    for number, samples in enumerate(intervals):
        history[number] = samples
        chosen = select_window(history, number)
        if chosen is None:
            continue
        change = tracker.update(judge(window(chosen)))
        if change is not None:
            changes.append((number, change))
    return tracker, changes


def test_a_rank_30_percent_slower_is_named_with_its_node() -> None:
    rnd = random.Random(1)
    tracker, changes = run([simulate(rnd, slow={5: 1.3}) for _ in range(12)])
    assert len(changes) == 1, changes
    number, change = changes[0]
    assert number == MIN_INTERVALS  # the first window, then the hysteresis' second
    assert [(f.rank, f.node, f.local_rank) for f in change.named] == [(5, "node1", 1)]
    assert 1.2 < change.named[0].ratio < 1.35
    assert change.named[0].wait_share < change.named[0].others_wait_share
    assert list(tracker.history) == [5]


@pytest.mark.parametrize("seed", range(20))
def test_noise_of_10_percent_on_every_rank_names_nobody(seed: int) -> None:
    rnd = random.Random(seed)
    # Steps from 50 ms to 2 s: the window grows until it holds 20 of them.
    compute = [0.05, 0.2, 1.0, 2.0][seed % 4]
    tracker, changes = run([simulate(rnd, compute=compute) for _ in range(30)])
    assert changes == [] and tracker.history == {}


def test_a_slow_data_loader_is_named_like_slow_compute() -> None:
    rnd = random.Random(2)
    _, changes = run([simulate(rnd, loader={2: 0.04}) for _ in range(8)])
    assert [f.rank for f in changes[0][1].named] == [2]


def test_a_slowdown_mid_job_is_named_then_cleared_once_each() -> None:
    rnd = random.Random(3)
    intervals = ([simulate(rnd) for _ in range(6)] + [simulate(rnd, slow={1: 1.4}) for _ in range(10)]
                 + [simulate(rnd) for _ in range(10)])
    _, changes = run(intervals)
    assert len(changes) == 2, changes
    (named_at, named), (cleared_at, cleared) = changes
    assert [f.rank for f in named.named] == [1] and not named.cleared
    assert 6 < named_at <= 6 + MIN_INTERVALS and 16 < cleared_at <= 16 + MIN_INTERVALS + 2
    assert cleared.named == [] and [f.rank for f in cleared.cleared] == [1]


def test_no_flapping_near_the_threshold() -> None:
    # Hovering between the clearing level and the threshold: named once, never cleared.
    rnd = random.Random(4)
    intervals = [simulate(rnd, slow={3: 1.3}) for _ in range(6)]
    intervals += [simulate(rnd, slow={3: 1.3 if i % 2 else 1.14}) for i in range(20)]
    _, changes = run(intervals)
    assert len(changes) == 1


def test_two_ranks_the_slow_one_against_the_other() -> None:
    # With two ranks the median of all would be half-way: each is judged against the other.
    rnd = random.Random(5)
    _, changes = run([simulate(rnd, ranks=2, slow={1: 1.3}) for _ in range(6)])
    assert [f.rank for f in changes[0][1].named] == [1]


def test_a_rank_working_more_that_nobody_waits_for_is_not_named() -> None:
    # Rank 0 works twice as much, but the others do not wait in collectives: it holds nobody.
    samples = [RankSample(0, "a", 0, 10.0, 0.1, 50, 0)] + [RankSample(r, "a", r, 10.0, 0.2, 50, 0) for r in (1, 2, 3)]
    findings = judge(samples)
    assert findings[0].ratio > 1.0 and not findings[0].over(DEFAULT_THRESHOLD)


def test_step_rates_name_the_slow_rank_without_collectives() -> None:
    samples = [RankSample(r, "a", r, 10.0, 0.0, 0, 100 if r != 2 else 70) for r in range(4)]
    findings = {f.rank: f for f in judge(samples)}
    assert findings[2].basis == "steps" and findings[2].ratio == pytest.approx(100 / 70)
    assert [r for r, f in findings.items() if f.over(DEFAULT_THRESHOLD)] == [2]


def test_nothing_to_judge() -> None:
    assert judge([]) == []
    assert judge([RankSample(0, "a", 0, 5.0, 1.0, 10, 0)]) == []
    assert StragglerTracker(1.2).update([]) is None
    idle = [RankSample(r, "a", r, 5.0, 0.0, 0, 0) for r in range(2)]
    assert select_window({0: idle}, 0) is None


def test_the_window_grows_until_every_rank_has_enough_steps() -> None:
    slow_steps = [RankSample(r, "a", r, 5.0, 1.0, 2, 0) for r in range(2)]  # 2 steps an interval
    history = dict.fromkeys(range(30), slow_steps)
    chosen = select_window(history, 29)
    assert chosen is not None and len(chosen) == MIN_EVENTS // 2


def test_every_node_gathers_the_same_intervals() -> None:
    a = {7: [RankSample(0, "a", 0, 1.0, 0.2, 5, 0)], 8: [RankSample(0, "a", 0, 1.0, 0.3, 5, 1)]}
    b = {7: [RankSample(1, "b", 0, 1.0, 0.1, 5, 0)]}
    keys = [encode("a", a), encode("b", b)]
    assert decode(keys[0]) == a
    assert gather(keys, [7, 8]) == {7: a[7] + b[7]}  # node b has not published 8 yet
    assert decode(b"not json") == {}


def test_a_rank_working_through_the_whole_window_is_named() -> None:
    # Rank 2 finished no collective in the window while the others sat in one, waiting for it.
    samples = [RankSample(r, "a", r, 10.0, 9.0, 1, 0) for r in (0, 1, 3)] + [RankSample(2, "a", 2, 10.0, 0.0, 0, 0)]
    findings = {f.rank: f for f in judge(samples)}
    assert findings[2].over(DEFAULT_THRESHOLD) and findings[2].ratio == pytest.approx(10.0)
    assert not any(f.over(DEFAULT_THRESHOLD) for r, f in findings.items() if r != 2)
