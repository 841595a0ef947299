"""Conformance suite for health checks (``launcher_health_checks``).

A check's ``check(context)`` answers a :class:`~launcher.health.api.CheckResult`: healthy, sick
with a one-line reason, or skipped with a one-line note. The suite asks it on the contexts of
:func:`standard_contexts` (a script, a ``-m`` module, a ``--no-python`` program, with and
without ``--log-dir``) and any the test class adds, and checks that every answer is one of the
three with a one-line reason, within the check's time limit, through the core's runner (no
exception, no overrun), leaving no process behind; that ``--health-checks NAME`` chooses it;
and, when the test class gives them, that a healthy context answers healthy and a sick one sick
(so that a check that always answers "healthy" does not pass).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from launcher.health.api import HEALTHY, SICK, SKIPPED, CheckContext, CheckResult
from launcher.health.runner import run_checks
from launcher.health.settings import HealthSettings, resolve_health_checks
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import HealthCheck, Registration
from launcher.testing.plugin_suite import PluginModuleConformance, manager_holding

__all__ = ["HealthCheckConformance", "standard_contexts"]


def standard_contexts(tmp_path: Path) -> list[CheckContext]:
    """Launches a check must answer for: a script, ``-m``, ``--no-python``, with ``--log-dir``."""
    env = dict(os.environ)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    base = CheckContext(node="node-a", env=env, temp_dir=str(tmp_path), python=sys.executable, script=str(script))
    return [
        base,
        CheckContext(node="node-a", env=env, temp_dir=str(tmp_path), python=sys.executable, module="json.tool"),
        CheckContext(node="node-a", env=env, temp_dir=str(tmp_path), python=None, nproc_per_node=2),
        CheckContext(node="node-a", env=env, temp_dir=str(tmp_path), log_dir=str(tmp_path / "logs"),
                     python=sys.executable, script=str(script), nproc_per_node=4),
    ]


def _children() -> set[int]:
    """Process ids of this process's children (Linux), to find what a check left running."""
    found: set[int] = set()
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/children") as handle:
                found |= {int(pid) for pid in handle.read().split()}
        except OSError:
            continue
    return found


def _assert_one_line(result: CheckResult, where: str) -> None:
    assert isinstance(result, CheckResult), f"{where}: answered {type(result).__name__}, not a CheckResult"
    assert result.status in (HEALTHY, SICK, SKIPPED), f"{where}: status {result.status!r}"
    if result.status != HEALTHY:
        assert result.reason.strip(), f"{where}: a {result.status} answer must say why in one line"
        assert "\n" not in result.reason and len(result.reason) <= 500, f"{where}: reason {result.reason!r}"


class HealthCheckConformance(PluginModuleConformance):
    """Tests a health check.

    Set ``health_check_name`` (the ``--health-checks`` name) or override the ``health_check``
    fixture. Override ``healthy_context`` and ``sick_context`` (fixtures returning a
    :class:`~launcher.health.api.CheckContext`, default ``None``: that test is skipped) with a
    launch the check must pass and one it must fail; ``contexts`` (a fixture) adds launches to
    :func:`standard_contexts`.
    """

    registration_type: ClassVar[type[Registration]] = HealthCheck
    registration_fixture: ClassVar[str] = "health_check"

    #: The ``--health-checks`` name under test.
    health_check_name: ClassVar[str | None] = None

    @pytest.fixture
    def health_check(self, plugin_manager: LauncherPluginManager) -> HealthCheck:
        """The registration under test (default: ``health_check_name`` on the plugin manager)."""
        return self.registration_under_test(plugin_manager, self.health_check_name, HealthCheck)

    @pytest.fixture
    def contexts(self, tmp_path: Path) -> Sequence[CheckContext]:
        """The launches every test asks the check about (default: :func:`standard_contexts`)."""
        return standard_contexts(tmp_path)

    @pytest.fixture
    def healthy_context(self) -> CheckContext | None:
        """A launch the check must answer healthy for (``None``: not tested)."""
        return None

    @pytest.fixture
    def sick_context(self) -> CheckContext | None:
        """A launch the check must answer sick for (``None``: not tested)."""
        return None

    def test_time_limit_and_description(self, health_check: HealthCheck) -> None:
        assert 0 < health_check.time_limit <= 3600
        assert health_check.description.strip() and "\n" not in health_check.description

    def test_answers_one_line_within_its_time_limit(self, health_check: HealthCheck,
                                                     contexts: Sequence[CheckContext]) -> None:
        for number, context in enumerate(contexts):
            started = time.monotonic()
            result = health_check.check(context)
            elapsed = time.monotonic() - started
            _assert_one_line(result, f"context {number}")
            assert elapsed < health_check.time_limit, f"context {number}: took {elapsed:.1f} s"

    def test_runs_through_the_runner_and_leaves_nothing(self, health_check: HealthCheck,
                                                        contexts: Sequence[CheckContext]) -> None:
        before = _children()
        for number, context in enumerate(contexts):
            (outcome,) = run_checks([health_check], context)
            assert outcome.name == health_check.name
            reason = outcome.result.reason
            assert not reason.startswith(("the check raised", "the check did not answer", "the check returned")), (
                f"context {number}: {reason}")
        assert _children() <= before, "the check left processes running"

    def test_chosen_by_name(self, health_check: HealthCheck) -> None:
        manager = manager_holding(health_check)
        for name in health_check.names:
            (chosen,) = resolve_health_checks(HealthSettings((name,)), manager)
            assert chosen is health_check

    def test_healthy_context_is_healthy(self, health_check: HealthCheck, healthy_context: CheckContext | None) -> None:
        if healthy_context is None:
            pytest.skip("no healthy_context given")
        result = health_check.check(healthy_context)
        assert result.status == HEALTHY, result.reason

    def test_sick_context_is_sick(self, health_check: HealthCheck, sick_context: CheckContext | None) -> None:
        if sick_context is None:
            pytest.skip("no sick_context given")
        result = health_check.check(sick_context)
        _assert_one_line(result, "sick_context")
        assert result.status == SICK, f"answered {result.status}: {result.reason}"
