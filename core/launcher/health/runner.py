"""Running health checks: all at once, each within its own time limit.

Each check runs in a daemon thread; :func:`start_checks` starts them and returns at once (the agent
runs them beside its rendezvous), and :meth:`RunningChecks.outcomes` waits for all of them up to
the longest limit (:func:`run_checks` does both).
A check still running at its limit is reported sick ("did not answer within N s"), and one that
raised is reported sick with the exception, both naming the check: a broken check must not
let a sick node in, nor hang the agent. Checks that run a process do it through
:func:`run_process`, which kills the process's whole group at the limit, so nothing a check
started outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.health.api import CheckContext, CheckResult, sick

if TYPE_CHECKING:  # pragma: no cover
    from launcher.plugins.types import HealthCheck

__all__ = ["CheckOutcome", "ProcessResult", "RunningChecks", "run_checks", "run_process", "start_checks"]

#: The job's watchdog token, which every process a check starts carries in its environment: the
#: agent sets it (launcher.containment.watchdog), so that if the agent dies mid-check the watchdog kills
#: the check's processes with the rest of the job. Empty outside an agent.
JOB_TOKEN: list[str] = []


@dataclass(frozen=True)
class CheckOutcome:
    """One check's answer, the check's name and how long it took."""

    name: str
    result: CheckResult
    seconds: float


class RunningChecks:
    """Checks started by :func:`start_checks`: each in a daemon thread of its own, the first one
    too (a check that hangs must not hang the agent). :meth:`outcomes` waits for them."""

    def __init__(self, checks: Sequence[HealthCheck], context: CheckContext) -> None:
        self._checks = tuple(checks)
        self._started = time.monotonic()
        self._results: dict[int, CheckOutcome] = {}
        self._threads: list[threading.Thread] = []
        closes = _CLOSES[0]  # a kill_check_processes() from now on is meant for these checks' processes
        for index, check in enumerate(self._checks):
            thread = threading.Thread(target=self._one, args=(index, check, context, closes),
                                      name=f"health-{check.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _one(self, index: int, check: HealthCheck, context: CheckContext, closes: int) -> None:
        _STARTED.closes = closes
        begun = time.monotonic()
        ctx = _with_limit(context, check.time_limit)
        try:
            result = check.check(ctx)
            if not isinstance(result, CheckResult):
                result = sick(f"the check returned {type(result).__name__}, not a CheckResult")
        except Exception as exc:  # a broken check is named, never lets the node in silently
            result = sick(f"the check raised {type(exc).__name__}: {exc}")
        self._results[index] = CheckOutcome(check.name, result, time.monotonic() - begun)

    def outcomes(self) -> list[CheckOutcome]:
        """Every check's outcome, in the order given, once each has answered or reached its
        limit (counted from the start): one still running at its limit is sick, and abandoned."""
        outcomes = []
        for index, check in enumerate(self._checks):
            self._threads[index].join(max(0.0, self._started + check.time_limit - time.monotonic()))
            outcome = self._results.get(index)
            if outcome is None:  # still running: its thread is a daemon, and is abandoned
                outcome = CheckOutcome(check.name, sick(f"the check did not answer within {check.time_limit:g} s"),
                                       check.time_limit)
            outcomes.append(outcome)
        return outcomes


def start_checks(checks: Sequence[HealthCheck], context: CheckContext) -> RunningChecks:
    """Start every check of ``checks`` on ``context``, in parallel, and return at once: the
    caller does other work beside them, then asks :meth:`RunningChecks.outcomes`."""
    return RunningChecks(checks, context)


def run_checks(checks: Sequence[HealthCheck], context: CheckContext) -> list[CheckOutcome]:
    """Every check of ``checks`` on ``context``, in parallel; the outcomes in the order given."""
    return start_checks(checks, context).outcomes()


def _with_limit(context: CheckContext, limit: float) -> CheckContext:
    from dataclasses import replace

    return context if context.time_limit == limit else replace(context, time_limit=limit)


@dataclass(frozen=True)
class ProcessResult:
    """How a process a check ran ended: ``returncode`` (``None`` when it overran and was killed)
    and its output (stdout and stderr together)."""

    returncode: int | None
    output: str

    @property
    def first_line(self) -> str:
        """The first non-empty line of the output, stripped ("" when it printed nothing)."""
        for line in self.output.splitlines():
            if line.strip():
                return line.strip()
        return ""


def run_process(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> ProcessResult:
    """Run ``argv`` in a process group of its own, for at most ``timeout`` seconds.

    At the limit the whole group is killed (SIGKILL), so children it started die with it, and the
    result has ``returncode`` ``None``. Output is read whole (a check's output is small).
    """
    full_env = dict(os.environ if env is None else env)
    if JOB_TOKEN:
        from launcher.containment.watchdog import job_env

        full_env = job_env(full_env, JOB_TOKEN[-1])
    closes = getattr(_STARTED, "closes", _CLOSES[0])
    process = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=full_env, start_new_session=True,
    )
    with _RUNNING_LOCK:
        _RUNNING.add(process.pid)
        # kill_check_processes() ran while this process was being started (it can run before
        # Popen returns, and the process may already be doing its work): it is one of those.
        if _CLOSES[0] != closes:
            _kill_group(process.pid)
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Exited already, but a child it left holds the output open: its own code counts.
        code = process.poll()
        _kill_group(process.pid)
        out, _ = process.communicate()
        return ProcessResult(code, out.decode(errors="replace"))
    finally:
        if process.returncode is None:  # an exception (KeyboardInterrupt) while waiting
            _kill_group(process.pid)
            process.wait()
        with _RUNNING_LOCK:
            _RUNNING.discard(process.pid)
    # A child that outlived its parent (daemonised into the group) is no check's business to keep.
    _kill_group(process.pid)
    return ProcessResult(process.returncode, out.decode(errors="replace"))


#: The process groups of the processes checks are running now (:func:`kill_check_processes`).
_RUNNING: set[int] = set()
_RUNNING_LOCK = threading.Lock()
#: How many times :func:`kill_check_processes` ran: a check's process started after one that came
#: since its check was started (:class:`RunningChecks`), or since :func:`run_process` was called
#: elsewhere, is killed as soon as it exists.
_CLOSES = [0]
_STARTED = threading.local()


def kill_check_processes() -> None:
    """Kill the process group of every process a check is running now (the agent ends without
    waiting for its checks' answer), and of one being started at this moment."""
    with _RUNNING_LOCK:
        _CLOSES[0] += 1
        running = list(_RUNNING)
    for pgid in running:
        _kill_group(pgid)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pgid, signal.SIGKILL)
