"""The learning rule for learned hang timeouts (launcher.hangs.learning): pure functions."""

from __future__ import annotations

import random

import pytest
from launcher.hangs.learning import IntervalLearner, LearningRule, learn, merge

RULE = LearningRule(factor=5.0, floor=10.0, warmup=3, window=4, min_growth=0.1)


def test_a_value_is_the_factor_times_the_longest_interval_never_below_the_floor():
    assert learn(RULE, None, 3.0) == 15.0
    assert learn(RULE, None, 0.5) == 10.0  # the floor
    assert learn(RULE, None, -1.0) == 10.0


def test_values_only_grow_and_only_by_a_clear_step():
    assert learn(RULE, 15.0, 1.0) == 15.0  # shorter intervals: kept (a rare long one stays learned)
    assert learn(RULE, 15.0, 3.2) == 15.0  # 16 is less than 10% more: no change, no log line
    assert learn(RULE, 15.0, 3.4) == 17.0


def test_warm_up_is_not_learned_from_and_a_value_comes_per_window():
    learner = IntervalLearner(RULE)
    changes = [learner.observe(interval) for interval in (60.0, 30.0, 20.0)]  # the first steps: slow
    assert changes == [None, None, None] and learner.timeout is None
    changes = [learner.observe(interval) for interval in (1.0, 2.0, 1.5)]
    assert changes == [None, None, None] and learner.timeout is None  # the window is not full yet
    assert learner.observe(1.0) == 10.0 and learner.timeout == 10.0  # 5 x 2 s is the floor
    # A window with a longer interval raises it; one with only shorter ones changes nothing.
    assert [learner.observe(i) for i in (1.0, 4.0, 1.0, 1.0)] == [None, None, None, 20.0]
    assert [learner.observe(i) for i in (1.0, 1.0, 1.0, 1.0)] == [None, None, None, None]
    assert learner.timeout == 20.0


def test_a_sampled_span_across_the_end_of_the_warm_up_is_counted_not_learned_from():
    # The agent looks once a second: a slow first batch (9 s) and the quick steps after it can
    # come as one span of many steps that ends past the warm-up. Its length is warm-up time
    # (Lightning learned 47 s from it); its steps count towards the window.
    learner = IntervalLearner(RULE)
    assert learner.observe(9.5, count=5) is None  # warm-up (3) and 2 counted steps, not its 9.5 s
    assert learner.observe(1.0, count=2) == 10.0  # the window (4) is full: 5 x 1 s, the floor


def test_a_value_kept_across_a_restart_is_the_starting_point():
    learner = IntervalLearner(RULE, timeout=30.0)
    assert [learner.observe(i) for i in (9.0,) * 6] == [None] * 6  # warm-up again, then a window
    assert learner.observe(9.0) == 45.0  # 5 x 9 s, above what was kept


def test_merge_takes_the_largest_learned_value():
    assert merge([None, 12.0, 30.0, None]) == 30.0
    assert merge([None, None]) is None
    assert merge([]) is None


def test_steady_noisy_steps_give_no_false_alarm():
    # 20 seeded jobs, steps of 50 ms to 2 s with 30% noise: every step after warm-up is well
    # under the learned value at the moment it happens.
    rule = LearningRule(factor=5.0, floor=1.0, warmup=10, window=50)
    for seed in range(20):
        rng = random.Random(seed)
        step = rng.uniform(0.05, 2.0)
        learner = IntervalLearner(rule)
        for _ in range(2000):
            interval = step * rng.uniform(0.7, 1.3)
            if learner.timeout is not None:
                assert interval < learner.timeout / 3, (seed, interval, learner.timeout)
            learner.observe(interval)
        assert learner.timeout is not None


def test_bad_rules_are_refused():
    with pytest.raises(ValueError):
        LearningRule(factor=0.5)
    with pytest.raises(ValueError):
        LearningRule(floor=0)
