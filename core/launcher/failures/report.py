"""Failure reports: which worker failed first, and why, in words a user can act on.

The agent collects a :class:`WorkerFailure` for each worker that did not succeed and builds one
:class:`FailureReport` from them. The report reads every worker's error file (written by
:func:`launcher.failures.record` or torch's ``@record``; the format is the same), picks the root
cause (the earliest failure) and renders it with its traceback, or, when there is no error file,
with the last lines the worker wrote to stderr. Deaths by signal are named and explained; a
``SIGKILL`` is marked "likely out of memory" when an :class:`~launcher.failures.oom.OomWatch`
has evidence of it.

The same report is available as JSON (:meth:`FailureReport.to_dict`, versioned by
``schema_version``) for schedulers and dashboards.

This module is the report's model: what was observed, what the report learned, the root cause,
and the JSON round trip. The console text is :mod:`launcher.failures.render`, the error-file
format :mod:`launcher.failures.errorfile`, and how a process ended in words
:mod:`launcher.failures.exits`; their public names stay importable from here.
"""

from __future__ import annotations

import json
import os
import signal as signal_module
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from launcher.failures.errorfile import ErrorFileContent, ErrorFileError, write_atomically
from launcher.failures.exits import exit_status, explain_signal, signal_name
from launcher.failures.render import format_time, render_ranks, render_report
from launcher.failures.shutdown_abort import explain_terminate_at_exit, is_terminate_at_exit

# Importable from here as before the report was split by job.
__all__ = [
    "REPORT_SCHEMA",
    "ErrorFileContent",
    "ErrorFileError",
    "FailureReport",
    "OomEvidence",
    "RankState",
    "ReportedFailure",
    "WorkerFailure",
    "explain_signal",
    "failure_time",
    "format_time",
    "render_ranks",
    "signal_name",
]

#: Identifies the JSON document; bumped with :attr:`FailureReport.schema_version` on incompatible change.
REPORT_SCHEMA = "launcher.failure-report"

_TABLE_MESSAGE_WIDTH = 60


class OomEvidence(Protocol):
    """What :meth:`FailureReport.from_failures` needs of an :class:`~launcher.failures.oom.OomWatch`."""

    def evidence(self, pid: int) -> str | None: ...


@dataclass
class WorkerFailure:
    """One worker that did not succeed, as the agent observed it.

    ``exitcode`` is the exit status, ``signal`` the number of the signal that killed it (one of
    the two is usually ``None``). A negative ``exitcode``, as :mod:`subprocess` reports a death by
    signal, is read as that signal. ``timestamp`` is when the agent saw the failure (seconds
    since the epoch); ``error_file`` the ``TORCHELASTIC_ERROR_FILE`` the worker was given,
    whether or not it wrote it; ``stderr_tail`` the last lines the worker wrote to stderr.
    """

    node: str
    rank: int
    local_rank: int
    role: str
    pid: int
    exitcode: int | None
    signal: int | None
    timestamp: float
    error_file: str | None = None
    stderr_tail: list[str] = field(default_factory=list)
    #: In a multi-node job: the node's group rank and address (the hostname alone may be
    #: shared by several nodes, containers say).
    group_rank: int | None = None
    node_addr: str | None = None
    #: Its code is known to have returned before it died (a function worker whose result the
    #: agent had taken): a death after that is one of the interpreter's exit.
    code_finished: bool = False
    #: It died of the signal the launcher sent to stop it (another rank failed or hung, the job
    #: was ending): a consequence, never the root cause while a rank that failed or hung is known.
    ended_by_launcher: bool = False
    #: Judged hung (``--hang-timeout``) and killed by the launcher at once, its stacks taken.
    hung: bool = False
    #: Its process was stopped (state T: SIGSTOP, a debugger) when the launcher stopped it.
    stopped: bool = False

    @property
    def node_label(self) -> str:
        """``host (node 1, 10.0.0.2)``, or the hostname alone outside a multi-node job."""
        extra = [f"node {self.group_rank}"] if self.group_rank is not None else []
        if self.node_addr and self.node_addr != self.node:
            extra.append(self.node_addr)
        return f"{self.node} ({', '.join(extra)})" if extra else self.node

    def __post_init__(self) -> None:
        if self.signal is None and self.exitcode is not None and self.exitcode < 0:
            self.signal = -self.exitcode

    @property
    def signal_name(self) -> str | None:
        """``SIGKILL`` and so on, or ``None`` when the worker exited on its own."""
        return None if self.signal is None else signal_name(self.signal)

    @property
    def shell_reported_signal(self) -> int | None:
        """The signal a shell means by exit status ``128 + n`` (a ``--no-python`` script's child)."""
        if self.signal is None and self.exitcode is not None and 128 < self.exitcode < 128 + 65:
            return self.exitcode - 128
        return None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dict."""
        return {
            "node": self.node,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "role": self.role,
            "pid": self.pid,
            "exitcode": self.exitcode,
            "signal": self.signal,
            "timestamp": self.timestamp,
            "error_file": self.error_file,
            "stderr_tail": list(self.stderr_tail),
            "group_rank": self.group_rank,
            "node_addr": self.node_addr,
            "code_finished": self.code_finished,
            "ended_by_launcher": self.ended_by_launcher,
            "hung": self.hung,
            "stopped": self.stopped,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkerFailure:
        """Inverse of :meth:`to_dict` (extra keys are ignored)."""
        return cls(
            node=data["node"],
            rank=data["rank"],
            local_rank=data["local_rank"],
            role=data["role"],
            pid=data["pid"],
            exitcode=data.get("exitcode"),
            signal=data.get("signal"),
            timestamp=data["timestamp"],
            error_file=data.get("error_file"),
            stderr_tail=list(data.get("stderr_tail") or []),
            group_rank=data.get("group_rank"),
            node_addr=data.get("node_addr"),
            code_finished=bool(data.get("code_finished", False)),
            ended_by_launcher=bool(data.get("ended_by_launcher", False)),
            hung=bool(data.get("hung", False)),
            stopped=bool(data.get("stopped", False)),
        )

    @property
    def blame_class(self) -> int:
        """Where it stands as a root cause: 0 hung, 1 failed on its own, 2 ended by the launcher."""
        if self.hung:
            return 0
        return 2 if self.ended_by_launcher else 1


#: States of a worker in :class:`RankState`.
RANK_STATES = ("failed", "killed by the agent", "succeeded", "running")


@dataclass
class RankState:
    """One worker of this node at the end of the job: what became of it.

    ``state`` is one of :data:`RANK_STATES`: it ``failed`` on its own, was ``killed by the
    agent`` (stopped because the job was ending), ``succeeded``, or is still ``running``.
    ``returncode`` is as :mod:`subprocess` reports it (``-n`` for signal ``n``).
    """

    rank: int
    local_rank: int
    pid: int | None
    state: str
    returncode: int | None = None

    def exit_text(self) -> str:
        """``signal SIGKILL``, ``exit code 1``, or ``-`` while it runs."""
        code = self.returncode
        if code is None:
            return "-"
        return exit_status(None, -code) if code < 0 else exit_status(code, None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "state": self.state,
            "returncode": self.returncode,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankState:
        return cls(data["rank"], data["local_rank"], data.get("pid"), data["state"], data.get("returncode"))


def failure_time(observed: float, recorded: float | None) -> float:
    """Best estimate of when a worker failed, from the agent's observation and its error file.

    The error file's time wins: a worker may record its exception long before it exits (cleanup,
    a hung collective), and that earlier moment is what decides the root cause. torch's format
    keeps whole seconds only, so when the observation falls within that second it is used
    instead, to order failures within one second consistently.
    """
    if recorded is None:
        return observed
    if recorded == int(recorded) and recorded <= observed < recorded + 1:
        return observed
    return recorded


@dataclass
class ReportedFailure:
    """A :class:`WorkerFailure` with what the report learned about it."""

    failure: WorkerFailure
    error: ErrorFileContent | None = None
    #: Why an existing error file could not be used, if it could not.
    error_file_problem: str | None = None
    likely_oom: bool = False
    oom_evidence: str | None = None

    @property
    def time(self) -> float:
        """When the worker failed (see :func:`failure_time`)."""
        return failure_time(self.failure.timestamp, self.error.timestamp if self.error else None)

    @property
    def traceback(self) -> str | None:
        return self.error.traceback if self.error else None

    def exit_description(self, *, short: bool = False) -> str:
        """``exit code 1``, ``signal SIGKILL (9), likely out of memory``, ...

        ``short`` leaves out the explanation of a shell's ``128 + n`` status, for tables.
        """
        failure = self.failure
        text = exit_status(failure.exitcode, failure.signal, with_number=True)
        shell_signal = failure.shell_reported_signal
        if shell_signal is not None:
            name = signal_name(shell_signal)
            if short:
                text += f" (128+{name})"
            else:
                text += f" (128 + {shell_signal}: how a shell reports a child killed by {name})"
        if self.likely_oom:
            text += ", likely out of memory"
        return text

    def explanation(self, *, after_hang: bool = False) -> str | None:
        """Why the worker died, for deaths by signal (and shell-reported ones); ``after_hang``:
        the launcher stopped the workers because of a hang."""
        signum = self.failure.signal
        if signum is None:
            signum = self.failure.shell_reported_signal
        if self.failure.hung:
            return hung_explanation(self.failure.stopped)
        if signum is None:
            return None
        if is_terminate_at_exit(self.failure.signal, self.failure.stderr_tail):
            return explain_terminate_at_exit(self.failure.code_finished)
        return explain_signal(signum, likely_oom=self.likely_oom, after_hang=after_hang)

    def summary(self) -> str:
        """The failure in one line: the error message, else the last stderr line."""
        if self.error and self.error.message:
            text = self.error.message
        else:
            lines = [line for line in self.failure.stderr_tail if line.strip()]
            text = lines[-1].strip() if lines else ""
        text = " ".join(text.split())
        if len(text) > _TABLE_MESSAGE_WIDTH:
            text = text[: _TABLE_MESSAGE_WIDTH - 3] + "..."
        return text

    def to_dict(self, *, after_hang: bool = False) -> dict[str, Any]:
        data = self.failure.to_dict()
        data.update(
            {
                "signal_name": self.failure.signal_name,
                "time": self.time,
                "time_text": format_time(self.time),
                "exit": self.exit_description(),
                "explanation": self.explanation(after_hang=after_hang),
                "error": self.error.to_dict() if self.error else None,
                "error_file_problem": self.error_file_problem,
                "likely_oom": self.likely_oom,
                "oom_evidence": self.oom_evidence,
            }
        )
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReportedFailure:
        error = data.get("error")
        return cls(
            failure=WorkerFailure.from_dict(data),
            error=ErrorFileContent.from_dict(error) if error else None,
            error_file_problem=data.get("error_file_problem"),
            likely_oom=bool(data.get("likely_oom", False)),
            oom_evidence=data.get("oom_evidence"),
        )


def hung_explanation(stopped: bool) -> str:
    """Why a hung rank died: the launcher judged it hung and killed it at once."""
    how = ("; its process was stopped (state T: SIGSTOP, a ^Z, or a debugger), so it could not have acted on "
           "SIGTERM" if stopped else "")
    return (f"hung: it stopped making progress past --hang-timeout{how}; the launcher killed it at once (SIGKILL) "
            "once its stacks were taken")


def _read_error(failure: WorkerFailure) -> tuple[ErrorFileContent | None, str | None]:
    path = failure.error_file
    if not path or not os.path.exists(path):
        return None, None
    try:
        return ErrorFileContent.read(path), None
    except (OSError, ErrorFileError) as exc:
        return None, str(exc)


@dataclass
class FailureReport:
    """Every failed worker of a run, the root cause (the earliest failure) first."""

    #: Version of :meth:`to_dict`'s layout; a change that breaks readers bumps it.
    schema_version: ClassVar[int] = 1

    failures: list[ReportedFailure]
    title: str = "workers failed"
    created: float = 0.0
    #: When the workers were stopped because of a hang: :meth:`launcher.hangs.report.HangReport.to_dict`.
    hang: dict[str, Any] | None = None
    #: Every worker of the node that writes the report, with its state (multi-node jobs).
    node_ranks: list[RankState] = field(default_factory=list)
    #: What the node that writes the report is (``host (node 1, 10.0.0.2)``), for its ranks' heading.
    this_node: str = ""
    #: One-line notes shown under the title (a store that is gone, a node that was lost).
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.failures:
            raise ValueError("a failure report needs at least one failure")

    @classmethod
    def from_failures(
        cls,
        failures: Sequence[WorkerFailure],
        *,
        oom_watch: OomEvidence | None = None,
        title: str | None = None,
        now: float | None = None,
    ) -> FailureReport:
        """Build the report: read error files, check ``SIGKILL``\\ s for OOM, order by time.

        ``oom_watch`` is the :class:`~launcher.failures.oom.OomWatch` the agent snapshotted when it
        started the workers; ``title`` the report's first line (default: how many failed).
        """
        if not failures:
            raise ValueError("a failure report needs at least one failure")
        reported: list[ReportedFailure] = []
        for failure in failures:
            error, problem = _read_error(failure)
            entry = ReportedFailure(failure, error=error, error_file_problem=problem)
            killed = failure.signal if failure.signal is not None else failure.shell_reported_signal
            if oom_watch is not None and killed == signal_module.SIGKILL:
                entry.oom_evidence = oom_watch.evidence(failure.pid)
                entry.likely_oom = entry.oom_evidence is not None
            reported.append(entry)
        # A hung rank first, then ranks that failed on their own; those the launcher stopped last.
        reported.sort(key=lambda r: (r.failure.blame_class, r.time, r.failure.timestamp, r.failure.rank))
        if title is None:
            count = len(reported)
            title = f"{count} worker{'s' if count != 1 else ''} failed"
        created = now if now is not None else time.time()
        return cls(reported, title=title, created=created)

    @property
    def root_cause(self) -> ReportedFailure:
        """The first failure: a hung rank's, else the earliest of a rank that failed on its own,
        else the earliest of a rank the launcher stopped."""
        return self.failures[0]

    @property
    def others(self) -> list[ReportedFailure]:
        """Every failure but the root cause, earliest first."""
        return self.failures[1:]

    def render(self) -> str:
        """The report as text for the console: root cause in full, the others in a table."""
        return render_report(self)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (layout versioned by ``schema_version``)."""
        return {
            "schema": REPORT_SCHEMA,
            "schema_version": self.schema_version,
            "title": self.title,
            "created": self.created,
            "root_cause": self.root_cause.to_dict(after_hang=bool(self.hang)),
            "other_failures": [entry.to_dict(after_hang=bool(self.hang)) for entry in self.others],
            **({"hang": self.hang} if self.hang else {}),
            "node_ranks": [r.to_dict() for r in self.node_ranks],
            "this_node": self.this_node,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FailureReport:
        """Inverse of :meth:`to_dict`; refuses a newer ``schema_version`` than this code knows."""
        version = data.get("schema_version")
        if data.get("schema") != REPORT_SCHEMA or not isinstance(version, int):
            raise ValueError("not a launcher failure report")
        if version > cls.schema_version:
            raise ValueError(
                f"failure report schema version {version} is newer than this launcher's "
                f"({cls.schema_version}); upgrade launcher to read it"
            )
        entries = [ReportedFailure.from_dict(data["root_cause"])]
        entries += [ReportedFailure.from_dict(item) for item in data.get("other_failures", [])]
        return cls(
            entries,
            title=data.get("title", "workers failed"),
            created=data.get("created", 0.0),
            hang=data.get("hang"),
            node_ranks=[RankState.from_dict(r) for r in data.get("node_ranks") or []],
            this_node=data.get("this_node", ""),
            notes=list(data.get("notes") or []),
        )

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_dict` to ``path`` (through a temporary file, so readers never see half)."""
        write_atomically(path, json.dumps(self.to_dict(), indent=2) + "\n")

    def root_cause_error(self) -> ErrorFileContent:
        """The root cause as an error file's content: what the launcher writes to its own
        ``TORCHELASTIC_ERROR_FILE``, as torchrun does, so whatever launched it reports the root
        cause instead of a bare exit status."""
        root = self.root_cause
        message = root.summary() or f"worker rank {root.failure.rank} {root.exit_description()}"
        return ErrorFileContent(
            message=f"rank {root.failure.rank} on {root.failure.node}: {message}",
            traceback=root.traceback or "\n".join(root.failure.stderr_tail),
            timestamp=root.time,
        )

    def write_error_file(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`root_cause_error` to ``path`` in the ``@record`` format; :class:`OSError`
        when it cannot be written."""
        self.root_cause_error().write(path)
