"""The hang report: which ranks are hung, and where every rank is, grouped by identical stack.

A node's share is a :class:`NodeSummary` (JSON-able, small enough to pass through the rendezvous
store: one line of stack per rank; full stacks stay in the node's stacks file). The
:class:`HangReport` joins every node's summary and renders::

    ========================================================================
    launcher: hang detected by node-b: rank 7 sent no heartbeat for 3.2 s (timeout 3 s)
    ------------------------------------------------------------------------
    Hung ranks:
      rank 7 on node-b (local rank 3, pid 4242): last heartbeat 3.2 s ago
    Where every rank is (main thread, innermost call first):
      rank 7: read (loader.py:88) <- next_batch (train.py:30) <- main (train.py:50)
      ranks 0-6, 8-15: all_reduce (distributed_c10d.py:2806) <- train_step (train.py:42) <- ...
    Full stacks: /logs/job/hang_stacks_attempt_0.txt (node-b)
    ========================================================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from launcher.hangs.flightrec import Analysis

_RULE = 72


@dataclass
class RankEntry:
    """One rank at the moment of the dump."""

    rank: int
    local_rank: int
    node: str
    pid: int | None
    #: Seconds since its last heartbeat (``None``: never sent one).
    age: float | None
    hung: bool
    summary: str
    quiet: str = ""
    reason: str = ""
    #: Full stacks (:func:`launcher.hangs.stacks.as_json`); local only, never sent to the store.
    stacks: dict[str, Any] | None = None
    #: Whether its main thread is inside ``torch.distributed`` (waiting in a collective, most likely).
    collective: bool = False
    #: Seconds since it started without a heartbeat (``None``: it sent one, or not known).
    waiting: float | None = None
    #: Its process was stopped (state T: SIGSTOP, a debugger) at the dump: it could not answer.
    stopped: bool = False

    def to_dict(self, *, full: bool = True) -> dict[str, Any]:
        data = {
            "rank": self.rank, "local_rank": self.local_rank, "node": self.node, "pid": self.pid,
            "age": None if self.age is None else round(self.age, 3), "hung": self.hung,
            "summary": self.summary, "quiet": self.quiet or None, "reason": self.reason or None,
            "collective": self.collective,
            "waiting": None if self.waiting is None else round(self.waiting, 3),
            "stopped": self.stopped,
        }
        if full and self.stacks is not None:
            data["stacks"] = self.stacks
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankEntry:
        return cls(
            rank=int(data["rank"]), local_rank=int(data["local_rank"]), node=str(data.get("node", "")),
            pid=data.get("pid"), age=data.get("age"), hung=bool(data.get("hung")),
            summary=str(data.get("summary", "")), quiet=data.get("quiet") or "",
            reason=data.get("reason") or "", stacks=data.get("stacks"), collective=bool(data.get("collective")),
            waiting=data.get("waiting"), stopped=bool(data.get("stopped")),
        )


@dataclass
class NodeSummary:
    """One node's ranks and where its full stacks are."""

    node: str
    group_rank: int
    ranks: list[RankEntry] = field(default_factory=list)
    stacks_file: str | None = None
    #: Each local rank's flight record, reduced (:func:`launcher.hangs.flightrec.summarise`), by
    #: global rank: the evidence the joined report compares.
    collectives: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self, *, full: bool = True) -> dict[str, Any]:
        data = {
            "node": self.node, "group_rank": self.group_rank, "stacks_file": self.stacks_file,
            "ranks": [entry.to_dict(full=full) for entry in self.ranks],
        }
        if self.collectives:
            data["collectives"] = self.collectives
        return data

    def to_bytes(self) -> bytes:
        """The compact form published through the store (no full stacks)."""
        return json.dumps(self.to_dict(full=False), separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeSummary:
        return cls(
            node=str(data.get("node", "")), group_rank=int(data.get("group_rank", 0)),
            ranks=[RankEntry.from_dict(item) for item in data.get("ranks", [])],
            stacks_file=data.get("stacks_file"),
            collectives=dict(data.get("collectives") or {}),
        )


def rank_ranges(ranks: Iterable[int]) -> str:
    """``0-6, 8-15`` for a set of ranks."""
    ordered = sorted(set(ranks))
    if not ordered:
        return ""
    parts = []
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        if rank is not None:
            start = prev = rank
    return ", ".join(parts)


def group_by_stack(entries: Sequence[RankEntry],
                   culprits: Sequence[RankEntry] | None = None) -> list[tuple[list[RankEntry], str]]:
    """Ranks with the same one-line stack together.

    Groups with hung ranks first: in the order of ``culprits`` (the hung ranks, likeliest first,
    see :func:`order_hung`) when given; then the smallest groups (the odd ones out are the
    interesting ones), then by lowest rank.
    """
    groups: dict[str, list[RankEntry]] = {}
    for entry in entries:
        groups.setdefault(entry.summary, []).append(entry)
    if culprits is None:
        culprits = order_hung(entries)
    place = {id(entry): index for index, entry in enumerate(culprits)}
    last = len(place)
    ordered = sorted(
        groups.items(),
        key=lambda item: (min(place.get(id(e), last) for e in item[1]), len(item[1]), min(e.rank for e in item[1])),
    )
    return [(members, summary) for summary, members in ordered]


def order_hung(entries: Sequence[RankEntry], tolerance: float = 1.0) -> list[RankEntry]:
    """The hung ranks of ``entries``, the likeliest culprit first.

    In a real hang the stuck rank and every rank waiting for it in a collective stop beating at
    about the same moment, so their ages alone cannot tell them apart. Among the hung ranks whose
    age is within ``tolerance`` seconds of the oldest (a rank hung in a quiet section without any
    heartbeat counts as the oldest), the odd ones out come first: ranks whose main thread is not
    inside ``torch.distributed``, then those in the smallest group of identical stacks, then the
    longest silent, then by rank. Ranks silent for clearly less time come after, the longest
    silent first.
    """
    hung = [entry for entry in entries if entry.hung]
    ages = [entry.age for entry in hung if entry.age is not None]
    oldest = max(ages, default=0.0)
    sizes: dict[str, int] = {}
    for entry in entries:
        sizes[entry.summary] = sizes.get(entry.summary, 0) + 1

    def key(entry: RankEntry) -> tuple[bool, bool, int, float, int]:
        age = entry.age if entry.age is not None else oldest
        if age >= oldest - tolerance:
            return False, entry.collective, sizes[entry.summary], -age, entry.rank
        return True, False, 0, -age, entry.rank

    return sorted(hung, key=key)


@dataclass
class HangReport:
    """Every node's view of a hang, joined (see the module docstring)."""

    detected_by: str
    reason: str
    nodes: list[NodeSummary]
    #: Group ranks of nodes that published no summary in time.
    missing: list[int] = field(default_factory=list)
    #: What happens next (``restarting (1 of 3 restarts left)``, ``stopping the job``).
    outcome: str = ""
    #: ``False`` for a dump asked for while the job runs (SIGUSR2 to the agent).
    is_hang: bool = True
    #: Hung ranks whose ages differ by less than this many seconds stopped together (see
    #: :func:`order_hung`): about the agent's check interval, plus the spread of the nodes' dumps.
    tolerance: float = 1.0
    #: What the ranks' flight records say (``None``: no rank had one).
    collectives: Analysis | None = None
    #: Nodes left out of a merged report too big to send to every node (launcher.hangs.cluster).
    omitted: int = 0

    @property
    def entries(self) -> list[RankEntry]:
        return sorted((e for node in self.nodes for e in node.ranks), key=lambda e: e.rank)

    @property
    def hung_ranks(self) -> list[RankEntry]:
        """Hung ranks, the likeliest culprit first: those the flight records blame, then in the
        order of :func:`order_hung`."""
        ordered = order_hung(self.entries, self.tolerance)
        blamed = self.collectives.blamed if self.collectives is not None else []
        return sorted(ordered, key=lambda entry: entry.rank not in blamed)

    @property
    def blamed_ranks(self) -> list[int]:
        """The ranks this hang is blamed on, likeliest first: those the flight records blame (hung
        or not), else the likeliest hung rank; empty when no rank is hung."""
        if self.collectives is not None and self.collectives.blamed:
            return list(self.collectives.blamed)
        hung = self.hung_ranks
        return [hung[0].rank] if hung else []

    def culprit_reason(self) -> str | None:
        """``rank 2 (local rank 2): no heartbeat for 3.1 s (timeout 3 s)`` for the rank blamed, for
        the headline, then what its flight record shows (``; did not enter collective #6 ...``)
        when it does; ``None`` when no rank is blamed."""
        blamed = self.blamed_ranks
        entry = next((e for e in self.entries if blamed and e.rank == blamed[0]), None)
        if entry is None:
            return None
        why = entry.reason or "stopped making progress"
        if self.collectives is not None and entry.rank in self.collectives.blamed:
            why = f"{why}; {self.collectives.blame_text(entry.rank)}"
        return f"rank {entry.rank} (local rank {entry.local_rank}): {why}"

    def headline(self) -> str:
        if not self.is_hang:
            return f"where every rank on {self.detected_by} is: {self.reason}"
        return f"hang detected by {self.detected_by}: {self.reason}"

    def render(self) -> str:
        lines = ["=" * _RULE, f"launcher: {self.headline()}", "-" * _RULE]
        hung = self.hung_ranks
        if hung:
            lines.append("Hung ranks:")
            for entry in hung:
                lines.append(f"  rank {entry.rank} on {entry.node} (local rank {entry.local_rank}, pid {entry.pid}): "
                             f"{_age_text(entry)}")
        else:
            lines.append("Hung ranks: none on the nodes that answered")
        # Told to beat (--hang-timeout) and never did: not judged, but not silently left out either.
        silent = [e for e in self.entries if not e.hung and e.age is None and e.waiting is not None]
        if silent:
            lines.append("Not watched yet (no heartbeat since they started):")
            lines += [f"  rank {e.rank} on {e.node} (local rank {e.local_rank}, pid {e.pid}): {_age_text(e)}"
                      for e in silent]
        lines.append("Where every rank is (main thread, innermost call first):")
        for members, summary in group_by_stack(self.entries, hung):
            ranks = [e.rank for e in members]
            label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"
            lines.append(f"  {label}: {summary}")
        if self.collectives is not None and self.collectives.lines():
            lines.append("Collectives (flight recorder, per process group):")
            lines += [f"  {line}" for line in self.collectives.lines()]
        if self.missing:
            lines.append(f"No answer from node(s) with group rank {rank_ranges(self.missing)}: their ranks are "
                         "not shown")
        if self.omitted:
            lines.append(f"{self.omitted} other node(s) left out here (the likeliest culprits' nodes are shown): "
                         "the whole report is in the first stacks file below")
        for node in self.nodes:
            if node.stacks_file:
                lines.append(f"Full stacks: {node.stacks_file} (on {node.node})")
        if self.outcome:
            lines.append(f"Next: {self.outcome}")
        lines.append("=" * _RULE)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict[str, Any]:
        return {
            "detected_by": self.detected_by,
            "reason": self.reason,
            "hung_ranks": [e.rank for e in self.hung_ranks],
            "groups": [
                {"ranks": [e.rank for e in members], "stack": summary}
                for members, summary in group_by_stack(self.entries, self.hung_ranks)
            ],
            "nodes": [node.to_dict() for node in self.nodes],
            "missing_group_ranks": list(self.missing),
            "outcome": self.outcome or None,
            "blamed_ranks": self.blamed_ranks,
            "collectives": self.collectives.to_dict() if self.collectives is not None else None,
        }


def _age_text(entry: RankEntry) -> str:
    if entry.reason:
        return entry.reason
    if entry.age is None:
        return f"no heartbeat yet after {entry.waiting:.0f} s" if entry.waiting is not None else "no heartbeat yet"
    return f"last heartbeat {entry.age:.1f} s ago"


def write_stacks_file(path: str, report: HangReport, node: NodeSummary) -> None:
    """The full stacks of this node's ranks, after the report, as text."""
    from launcher.hangs.stacks import RankStacks, ThreadStack, format_threads

    parts = [report.render(), "", f"Full stacks of the ranks on {node.node}:", ""]
    for entry in node.ranks:
        stacks = RankStacks(entry.local_rank, pid=entry.pid)
        data = entry.stacks or {}
        stacks.note = data.get("note") or ""
        stacks.native = data.get("native") or ""
        stacks.text = data.get("text") or ""
        from launcher.hangs.stacks import Frame

        stacks.threads = [
            ThreadStack(t["ident"], [Frame(f["file"], f["line"], f["function"]) for f in t["frames"]])
            for t in data.get("threads", [])
        ]
        state = "HUNG, " + _age_text(entry) if entry.hung else _age_text(entry)
        parts.append(f"rank {entry.rank} (local rank {entry.local_rank}, pid {entry.pid}): {state}")
        parts.append(format_threads(stacks))
        parts.append("")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("\n".join(parts))
    os.replace(tmp, path)


def hang_outcome(remaining_restarts: int, max_restarts: int, *, in_place: bool = False) -> str:
    """What the agent does after a hang: the words of the hang report's outcome line (``in_place``:
    every local worker can recover in place, launcher.recovery)."""
    if remaining_restarts > 0:
        number = max_restarts - remaining_restarts + 1
        if in_place:
            return f"recovering in place (restart {number} of {max_restarts}); a full restart if it cannot"
        return f"stopping the workers and restarting them (restart {number} of {max_restarts})"
    return "stopping the workers; no restarts left, the job fails"
