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
"""

from __future__ import annotations

import json
import os
import signal as signal_module
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol

#: Identifies the JSON document; bumped with :attr:`FailureReport.schema_version` on incompatible change.
REPORT_SCHEMA = "launcher.failure-report"

_RULE_WIDTH = 72
_TEXT_WIDTH = 100
_TABLE_MESSAGE_WIDTH = 60

# Why a process dies of each signal, in the words a user needs to act. Only signals that kill
# by default and are seen in practice; others are named without an explanation.
_SIGNAL_EXPLANATIONS: dict[str, str] = {
    "SIGHUP": (
        "hang-up: the terminal or SSH session that started the job closed, or someone sent SIGHUP. "
        "`nohup` alone is not always enough (a launcher that forwards signals passes the hang-up "
        "on); start the job in a session of its own: `setsid nohup launcher ... > job.log 2>&1 &`, "
        "or inside tmux/screen, or through a scheduler"
    ),
    "SIGINT": "interrupted (Ctrl-C, or SIGINT sent by another process)",
    "SIGQUIT": "quit (Ctrl-\\, or SIGQUIT sent by another process)",
    "SIGILL": (
        "illegal instruction: native code built for a newer CPU than this node's, or a corrupted binary"
    ),
    "SIGABRT": (
        "aborted by native code: a failed C/C++ assertion, an uncaught C++ exception, or a library "
        "(e.g. the NCCL watchdog) deciding to stop the process; see the stderr tail"
    ),
    "SIGBUS": (
        "bus error: often shared memory (/dev/shm) ran out, e.g. data-loader workers in a container "
        "with the default 64 MB /dev/shm (raise it, e.g. `docker run --shm-size`), or a memory-mapped "
        "file was truncated"
    ),
    "SIGFPE": "arithmetic fault in native code (e.g. integer division by zero)",
    "SIGKILL": (
        "killed, which no process can catch: by the kernel's out-of-memory killer, by a scheduler "
        "enforcing a limit, or by `kill -9`"
    ),
    "SIGSEGV": (
        "segmentation fault: invalid memory access in native code (a C/C++/CUDA extension or a "
        "driver); the stderr tail shows the Python stack when faulthandler was on (it is with @record)"
    ),
    "SIGPIPE": "wrote to a pipe or socket whose reader had gone",
    "SIGTERM": (
        "asked to stop: by the launcher after another worker failed, by a scheduler (preemption, "
        "time limit), or by a user"
    ),
    "SIGXCPU": "CPU-time limit exceeded (ulimit -t)",
    "SIGXFSZ": "file-size limit exceeded (ulimit -f)",
}

_OOM_EXPLANATION = (
    "killed by the kernel's out-of-memory killer (likely out of memory): the node or the job's "
    "memory cgroup ran out of memory; reduce memory use per worker (batch size, data-loader "
    "workers, pinned memory) or request more memory"
)


class OomEvidence(Protocol):
    """What :meth:`FailureReport.from_failures` needs of an :class:`~launcher.failures.oom.OomWatch`."""

    def evidence(self, pid: int) -> str | None: ...


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9, and so on; ``signal <n>`` for a number this platform does not name."""
    try:
        return signal_module.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def explain_signal(signum: int, *, likely_oom: bool = False) -> str | None:
    """One sentence on why a process dies of ``signum`` and what to do, or ``None`` if unknown."""
    name = signal_name(signum)
    if likely_oom and name == "SIGKILL":
        return _OOM_EXPLANATION
    return _SIGNAL_EXPLANATIONS.get(name)


def format_time(timestamp: float) -> str:
    """A timestamp as local time with its UTC offset, to the millisecond."""
    return datetime.fromtimestamp(timestamp).astimezone().isoformat(sep=" ", timespec="milliseconds")


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
        )


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
        code = self.returncode
        if code is None:
            return "-"
        return f"signal {signal_name(-code)}" if code < 0 else f"exit code {code}"

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


def render_ranks(ranks: Sequence[RankState], heading: str) -> list[str]:
    """``heading`` and a table of ``ranks`` (rank, local rank, pid, state, exit)."""
    header = ("rank", "local", "pid", "state", "exit")
    rows = [
        (str(r.rank), str(r.local_rank), str(r.pid) if r.pid is not None else "-", r.state, r.exit_text())
        for r in sorted(ranks, key=lambda r: r.rank)
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]

    def line(row: Sequence[str]) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        return ("  " + "  ".join([*cells, row[-1]])).rstrip()

    return [heading, line(header), *(line(row) for row in rows)]


class ErrorFileError(ValueError):
    """An error file exists but is not in a format the report understands."""


@dataclass(frozen=True)
class ErrorFileContent:
    """What a worker's error file says.

    Two shapes are read, both written by torch: the ``@record`` one (``message`` is an object with
    ``message``, ``extraInfo.py_callstack`` and ``extraInfo.timestamp``) and the plain one
    (``message`` a string, ``timestamp`` beside it).
    """

    message: str
    traceback: str | None = None
    timestamp: float | None = None
    error_code: int | None = None

    @classmethod
    def read(cls, path: str) -> ErrorFileContent:
        """Read and parse ``path``; :class:`ErrorFileError` (or ``OSError``) when it cannot be."""
        with open(path, encoding="utf-8", errors="replace") as fp:
            text = fp.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            what = "empty" if not text.strip() else f"not JSON ({exc})"
            raise ErrorFileError(f"error file {path} is {what}") from None
        return cls.parse(data)

    @classmethod
    def parse(cls, data: Any) -> ErrorFileContent:
        """Parse the decoded JSON of an error file."""
        if not isinstance(data, dict) or "message" not in data:
            raise ErrorFileError("error file has no 'message'")
        message = data["message"]
        if isinstance(message, str):
            return cls(message=message, timestamp=_number(data.get("timestamp")))
        if not isinstance(message, dict):
            raise ErrorFileError("error file 'message' is neither a string nor an object")
        extra = message.get("extraInfo")
        extra = extra if isinstance(extra, dict) else {}
        callstack = extra.get("py_callstack")
        code = message.get("errorCode")
        return cls(
            message=str(message.get("message", "")),
            traceback=callstack if isinstance(callstack, str) and callstack.strip() else None,
            timestamp=_number(extra.get("timestamp")),
            error_code=code if isinstance(code, int) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "message": self.message,
            "traceback": self.traceback,
            "timestamp": self.timestamp,
            "error_code": self.error_code,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ErrorFileContent:
        return cls(
            message=data.get("message", ""),
            traceback=data.get("traceback"),
            timestamp=data.get("timestamp"),
            error_code=data.get("error_code"),
        )


def _number(value: Any) -> float | None:
    # torch writes the timestamp as a string of whole seconds; accept numbers too.
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


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
        if failure.signal is not None:
            text = f"signal {signal_name(failure.signal)} ({failure.signal})"
        elif failure.exitcode is not None:
            text = f"exit code {failure.exitcode}"
            shell_signal = failure.shell_reported_signal
            if shell_signal is not None:
                name = signal_name(shell_signal)
                if short:
                    text += f" (128+{name})"
                else:
                    text += f" (128 + {shell_signal}: how a shell reports a child killed by {name})"
        else:
            text = "unknown exit status"
        if self.likely_oom:
            text += ", likely out of memory"
        return text

    def explanation(self) -> str | None:
        """Why the worker died, for deaths by signal (and shell-reported ones)."""
        signum = self.failure.signal
        if signum is None:
            signum = self.failure.shell_reported_signal
        if signum is None:
            return None
        return explain_signal(signum, likely_oom=self.likely_oom)

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

    def to_dict(self) -> dict[str, Any]:
        data = self.failure.to_dict()
        data.update(
            {
                "signal_name": self.failure.signal_name,
                "time": self.time,
                "time_text": format_time(self.time),
                "exit": self.exit_description(),
                "explanation": self.explanation(),
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
        reported.sort(key=lambda r: (r.time, r.failure.timestamp, r.failure.rank))
        if title is None:
            count = len(reported)
            title = f"{count} worker{'s' if count != 1 else ''} failed"
        created = now if now is not None else time.time()
        return cls(reported, title=title, created=created)

    @property
    def root_cause(self) -> ReportedFailure:
        """The earliest failure."""
        return self.failures[0]

    @property
    def others(self) -> list[ReportedFailure]:
        """Every failure but the root cause, earliest first."""
        return self.failures[1:]

    def render(self) -> str:
        """The report as text for the console: root cause in full, the others in a table."""
        heavy, light = "=" * _RULE_WIDTH, "-" * _RULE_WIDTH
        lines = [heavy, f"launcher: {self.title}"]
        lines += [f"  {note}" for note in self.notes]
        lines.append(light)
        if self.hang:
            lines += _render_hang(self.hang) + [light]
        lines.append("Root cause (first failure):")
        lines += _render_root(self.root_cause)
        if self.others:
            lines += [light, f"Other failures ({len(self.others)}):"]
            lines += _render_table(self.others)
        if self.node_ranks:
            where = f" ({self.this_node})" if self.this_node else ""
            lines += [light, *render_ranks(self.node_ranks, f"Ranks on this node{where}:")]
        lines.append(heavy)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (layout versioned by ``schema_version``)."""
        return {
            "schema": REPORT_SCHEMA,
            "schema_version": self.schema_version,
            "title": self.title,
            "created": self.created,
            "root_cause": self.root_cause.to_dict(),
            "other_failures": [entry.to_dict() for entry in self.others],
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
        target = os.fspath(path)
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fp:
            json.dump(self.to_dict(), fp, indent=2)
            fp.write("\n")
        os.replace(tmp, target)


def _field(label: str, value: str) -> str:
    # Long values (explanations) wrap under the value column, so the labels stay scannable.
    head = f"  {label:<11}: "
    if len(head) + len(value) <= _TEXT_WIDTH:
        return (head + value).rstrip()
    return textwrap.fill(
        value,
        width=_TEXT_WIDTH,
        initial_indent=head,
        subsequent_indent=" " * len(head),
        # Paths and commands stay whole, even when longer than a line.
        break_on_hyphens=False,
        break_long_words=False,
    )


def _indented(text: str, prefix: str = "    ") -> list[str]:
    return [f"{prefix}{line}" if line else prefix.rstrip() for line in text.rstrip("\n").splitlines()]


def _render_root(entry: ReportedFailure) -> list[str]:
    failure = entry.failure
    lines = [
        _field("time", format_time(entry.time)),
        _field("node", failure.node_label),
        _field("rank", f"{failure.rank} (local rank {failure.local_rank}, role {failure.role})"),
        _field("pid", str(failure.pid)),
        _field("exit", entry.exit_description()),
    ]
    explanation = entry.explanation()
    if explanation:
        lines.append(_field("why", explanation))
    if entry.oom_evidence:
        lines.append(_field("evidence", entry.oom_evidence))
    if entry.error is not None:
        lines.append(_field("error file", failure.error_file or ""))
        if entry.error.message:
            lines.append(_field("error", entry.error.message))
    elif entry.error_file_problem:
        lines.append(_field("error file", entry.error_file_problem))
    if entry.traceback:
        lines.append(_field("traceback", ""))
        lines += _indented(entry.traceback)
        return lines
    tail = failure.stderr_tail
    if tail:
        count = len(tail)
        lines.append(_field("stderr", f"last {count} line{'s' if count != 1 else ''}:"))
        lines += _indented("\n".join(line.rstrip("\n") for line in tail), prefix="    | ")
    else:
        lines.append(_field("stderr", "(nothing was written to stderr)"))
    shows_traceback = any("Traceback (most recent call last)" in line for line in failure.stderr_tail)
    if failure.signal is None and entry.error is None and not shows_traceback:
        # The most useful advice for an exception without a traceback in the report.
        lines.append(
            _field(
                "hint",
                "decorate the script's main function with @launcher.failures.record (or torch's "
                "@record) to see the traceback here",
            )
        )
    return lines


def _render_hang(hang: Mapping[str, Any]) -> list[str]:
    """The hang that stopped the workers: hung ranks, and every rank's place by identical stack."""
    hung = hang.get("hung_ranks") or []
    lines = [_field("hang", f"detected by {hang.get('detected_by')}: {hang.get('reason')}")]
    lines.append(_field("hung ranks", ", ".join(str(rank) for rank in hung) or "none named"))
    lines.append("  where every rank was (main thread, innermost call first):")
    for group in hang.get("groups") or []:
        ranks = group.get("ranks") or []
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)}"
        lines.append(f"    {label}: {group.get('stack')}")
    for node in hang.get("nodes") or []:
        if node.get("stacks_file"):
            lines.append(_field("stacks", f"{node['stacks_file']} (on {node.get('node')})"))
    return lines


def _ranges(ranks: Sequence[int]) -> str:
    from launcher.hangs.report import rank_ranges

    return rank_ranges(ranks)


def _render_table(entries: Sequence[ReportedFailure]) -> list[str]:
    header = ("time", "node", "rank", "local", "pid", "exit", "error")
    rows = [
        (
            format_time(entry.time),
            entry.failure.node_label,
            str(entry.failure.rank),
            str(entry.failure.local_rank),
            str(entry.failure.pid),
            entry.exit_description(short=True),
            entry.summary(),
        )
        for entry in entries
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]

    def line(row: Sequence[str]) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        return ("  " + "  ".join([*cells, row[-1]])).rstrip()

    return [line(header), *(line(row) for row in rows)]
