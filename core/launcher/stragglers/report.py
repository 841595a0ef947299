"""What straggler detection says: one line per change, a line when it clears, and the job's list at its end."""

from __future__ import annotations

from collections.abc import Sequence

from launcher.stragglers.verdict import Change, Finding


def _percent(share: float) -> str:
    return f"{100.0 * share:.0f}%"


def evidence(finding: Finding) -> str:
    """Why ``finding`` names its rank, in words."""
    if finding.basis == "steps":
        return (f"{finding.step_rate:.3g} steps/s against the other ranks' median {finding.others_step_rate:.3g} "
                f"over the last {finding.window:.0f} s")
    text = (f"over the last {finding.window:.0f} s it spent {_percent(finding.work_share)} of its time outside "
            f"collectives against {_percent(finding.others_work_share)} for the median rank, which waited "
            f"{_percent(finding.others_wait_share)} of its time in collectives against its "
            f"{_percent(finding.wait_share)}")
    if finding.step_rate:
        text += f"; {finding.step_rate:.3g} steps/s"
    return text


def describe(finding: Finding) -> str:
    """``rank 3 (node n1, local rank 1) is 1.31x slower than the median rank: <evidence>``."""
    return (f"rank {finding.rank} (node {finding.node}, local rank {finding.local_rank}) is {finding.ratio:.2f}x "
            f"slower than the median rank: {evidence(finding)}")


def change_lines(change: Change, threshold: float) -> list[str]:
    """The lines a change prints: one naming the stragglers now, one per rank cleared."""
    lines = []
    for finding in change.cleared:
        lines.append(f"launcher: straggler cleared: rank {finding.rank} (node {finding.node}) is back within "
                     f"{finding.ratio:.2f}x of the median rank")
    if change.named:
        named = "; ".join(describe(f) for f in change.named)
        count = "straggler" if len(change.named) == 1 else f"{len(change.named)} stragglers"
        lines.append(f"launcher: {count}: {named} (threshold {threshold:g}x)")
    return lines


def final_line(history: Sequence[Finding]) -> str | None:
    """The job's stragglers at its end (the worst window of each), or ``None`` when there were none."""
    if not history:
        return None
    items = ", ".join(f"rank {f.rank} (node {f.node}, up to {f.ratio:.2f}x slower than the median rank)"
                      for f in sorted(history, key=lambda f: f.rank))
    return f"launcher: stragglers seen during this job: {items}"


def excluded_line(excluded: dict[str, str]) -> str:
    """The nodes put out of the job as stragglers (``--straggler-action exclude``), with why."""
    items = "; ".join(f"node {node} ({reason})" for node, reason in excluded.items())
    return f"launcher: nodes put out of this job as stragglers: {items}"


def event_fields(change: Change, threshold: float) -> dict[str, object]:
    """The ``straggler_detected`` event's data (launcher.events.model)."""
    return {
        "stragglers": [{"rank": f.rank, "node": f.node, "local_rank": f.local_rank, "ratio": round(f.ratio, 3),
                        "evidence": evidence(f)} for f in change.named],
        "cleared": [f.rank for f in change.cleared],
        "threshold": threshold,
    }
