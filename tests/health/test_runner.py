"""The runner: checks in parallel, each within its time limit, a raising check named."""

from __future__ import annotations

import threading
import time

from launcher.health.api import CheckContext, healthy, sick, skipped
from launcher.health.runner import run_checks, run_process
from launcher.plugins.types import HealthCheck

CONTEXT = CheckContext(node="n")


def test_checks_run_in_parallel():
    barrier = threading.Barrier(3, timeout=10)

    def meet(context):
        barrier.wait()  # passes only if all three run at once
        return healthy()

    checks = [HealthCheck(name=f"c{i}", check=meet, time_limit=20.0) for i in range(3)]
    outcomes = run_checks(checks, CONTEXT)
    assert [o.result.status for o in outcomes] == ["healthy"] * 3, outcomes


def test_overrun_and_raise_are_named_and_do_not_wait_for_others():
    release = threading.Event()

    def slow(context):
        release.wait(60)
        return healthy()

    def broken(context):
        raise KeyError("nvml_handle")

    checks = [
        HealthCheck(name="slow", check=slow, time_limit=0.5),
        HealthCheck(name="broken", check=broken),
        HealthCheck(name="fine", check=lambda c: skipped("not here")),
        HealthCheck(name="bad-type", check=lambda c: True),  # type: ignore[arg-type,return-value]
    ]
    started = time.monotonic()
    outcomes = run_checks(checks, CONTEXT)
    release.set()
    assert time.monotonic() - started < 20
    by_name = {o.name: o.result for o in outcomes}
    assert by_name["slow"].is_sick and by_name["slow"].reason == "the check did not answer within 0.5 s"
    assert by_name["broken"].is_sick and by_name["broken"].reason == "the check raised KeyError: 'nvml_handle'"
    assert by_name["fine"].status == "skipped"
    assert by_name["bad-type"].is_sick and "not a CheckResult" in by_name["bad-type"].reason
    assert [o.name for o in outcomes] == ["slow", "broken", "fine", "bad-type"]


def test_each_check_sees_its_own_time_limit():
    seen = {}

    def record(context):
        seen[context.time_limit] = True
        return sick("x\ny")

    outcomes = run_checks([HealthCheck(name="a", check=record, time_limit=3.0)], CONTEXT)
    assert seen == {3.0: True}
    assert outcomes[0].result.reason == "x y"  # one line


def test_run_process_output_and_limit():
    result = run_process(["sh", "-c", "echo one; echo two >&2; exit 4"], 10)
    assert result.returncode == 4 and result.first_line == "one" and "two" in result.output
    started = time.monotonic()
    result = run_process(["sh", "-c", "sleep 60"], 0.3)
    assert result.returncode is None and time.monotonic() - started < 20


def test_a_process_started_after_the_agent_gave_up_on_its_check_is_killed():
    """kill_check_processes() can come before a check's process exists (the agent ends while the
    check is still getting ready, or while Popen is still returning): that process is killed too."""
    from launcher.health.runner import kill_check_processes, start_checks

    go, answers = threading.Event(), []

    def late(context):
        assert go.wait(30)
        answers.append(run_process(["sh", "-c", "sleep 600"], 60))
        return healthy()

    running = start_checks([HealthCheck(name="late", check=late, time_limit=60.0)], CONTEXT)
    kill_check_processes()  # the agent ends first
    go.set()
    (outcome,) = running.outcomes()
    assert outcome.result.status == "healthy" and answers[0].returncode == -9, answers


def test_a_check_started_after_a_kill_is_not_touched_by_it():
    from launcher.health.runner import kill_check_processes

    kill_check_processes()  # an earlier agent in this process ended
    result = run_process(["sh", "-c", "exit 5"], 10)
    assert result.returncode == 5
    (outcome,) = run_checks([HealthCheck(name="next", check=lambda c: sick(str(run_process(
        ["sh", "-c", "exit 6"], 10).returncode)), time_limit=20.0)], CONTEXT)
    assert outcome.result.reason == "6"
