"""The failure report as console text: the root cause in full, other failures and ranks in tables.

Everything here turns the report's model (:mod:`launcher.failures.report`) into lines; nothing
decides what failed or why.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from launcher.failures.report import FailureReport, RankState, ReportedFailure

__all__ = ["format_time", "render_ranks", "render_report"]

_RULE_WIDTH = 72
_TEXT_WIDTH = 100


def format_time(timestamp: float) -> str:
    """A timestamp as local time with its UTC offset, to the millisecond."""
    return datetime.fromtimestamp(timestamp).astimezone().isoformat(sep=" ", timespec="milliseconds")


def render_report(report: FailureReport) -> str:
    """The report as text for the console: root cause in full, the others in a table."""
    heavy, light = "=" * _RULE_WIDTH, "-" * _RULE_WIDTH
    lines = [heavy, f"launcher: {report.title}"]
    lines += [f"  {note}" for note in report.notes]
    lines.append(light)
    if report.hang:
        lines += _render_hang(report.hang) + [light]
    lines.append("Root cause (first failure):")
    blamed = (report.hang or {}).get("blamed_ranks") or []
    lines += _render_root(report.root_cause, after_hang=bool(report.hang),
                          blamed=bool(blamed) and report.root_cause.failure.rank == blamed[0])
    if report.others:
        lines += [light, f"Other failures ({len(report.others)}):"]
        lines += _render_table(report.others)
    if report.node_ranks:
        where = f" ({report.this_node})" if report.this_node else ""
        lines += [light, *render_ranks(report.node_ranks, f"Ranks on this node{where}:")]
    lines.append(heavy)
    return "\n".join(lines)


def render_ranks(ranks: Sequence[RankState], heading: str) -> list[str]:
    """``heading`` and a table of ``ranks`` (rank, local rank, pid, state, exit)."""
    header = ("rank", "local", "pid", "state", "exit")
    rows = [
        (str(r.rank), str(r.local_rank), str(r.pid) if r.pid is not None else "-", r.state, r.exit_text())
        for r in sorted(ranks, key=lambda r: r.rank)
    ]
    return [heading, *_table(header, rows)]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """``header`` and ``rows`` in aligned columns; the last column is left ragged."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]

    def line(row: Sequence[str]) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        return ("  " + "  ".join([*cells, row[-1]])).rstrip()

    return [line(header), *(line(row) for row in rows)]


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


def _render_root(entry: ReportedFailure, *, after_hang: bool = False, blamed: bool = False) -> list[str]:
    failure = entry.failure
    lines = [
        _field("time", format_time(entry.time)),
        _field("node", failure.node_label),
        _field("rank", f"{failure.rank} (local rank {failure.local_rank}, role {failure.role})"),
        _field("pid", str(failure.pid)),
        _field("exit", entry.exit_description()),
    ]
    explanation = entry.explanation(after_hang=after_hang)
    if blamed:
        # Its exit is the launcher's doing; what makes it the root cause is the hang.
        explanation = "the hang is blamed on this rank (see the hang above); " + (explanation or "")
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
    from launcher.hangs.report import rank_ranges

    hung = hang.get("hung_ranks") or []
    lines = [_field("hang", f"detected by {hang.get('detected_by')}: {hang.get('reason')}")]
    lines.append(_field("hung ranks", ", ".join(str(rank) for rank in hung) or "none named"))
    lines.append("  where every rank was (main thread, innermost call first):")
    for group in hang.get("groups") or []:
        ranks = group.get("ranks") or []
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"
        lines.append(f"    {label}: {group.get('stack')}")
    if hang.get("collectives"):
        from launcher.hangs.flightrec import Analysis

        evidence = Analysis.from_dict(hang["collectives"]).lines()
        if evidence:
            lines.append("  collectives (flight recorder, per process group):")
            lines += [f"    {line}" for line in evidence]
    for node in hang.get("nodes") or []:
        if node.get("stacks_file"):
            lines.append(_field("stacks", f"{node['stacks_file']} (on {node.get('node')})"))
    return lines


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
    return _table(header, rows)
