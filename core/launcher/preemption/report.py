"""What a preempted node says: who received the signal, and how each local rank ended."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.preemption.settings import PREEMPTED_EXIT


@dataclass(frozen=True)
class RankEnd:
    """How one local worker ended during (or at the end of) the grace."""

    local_rank: int
    rank: int
    pid: int | None
    #: Its exit status (negative: the signal that killed it, as :mod:`subprocess` says).
    returncode: int | None
    #: It was still running at the end of the grace and was stopped.
    stopped: bool


@dataclass(frozen=True)
class PreemptionReport:
    """One node's account of a preemption."""

    node: str
    signal_name: str
    received_by: str
    #: Whether this node received the signal itself (else another node's notice reached it).
    local: bool
    grace: float
    ranks: list[RankEnd] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return PREEMPTED_EXIT

    @property
    def saved(self) -> list[RankEnd]:
        """The workers that exited by themselves, with status 0, within the grace."""
        return [r for r in self.ranks if not r.stopped and r.returncode == 0]

    def render(self) -> str:
        """``node X: job preempted (SIGTERM received here): ...`` and one line per rank that did
        not save and exit cleanly within the grace."""
        source = "received here" if self.local else f"received by {self.received_by}"
        grace = str(int(self.grace)) if float(self.grace).is_integer() else f"{self.grace:g}"
        lines = [
            f"node {self.node}: job preempted ({self.signal_name} {source}); {len(self.saved)} of "
            f"{len(self.ranks)} local worker(s) exited cleanly within the {grace} s grace; exit status {PREEMPTED_EXIT}"
        ]
        for end in self.ranks:
            who = f"local rank {end.local_rank} (rank {end.rank}, pid {end.pid})"
            if end.stopped:
                lines.append(f"  {who} ignored the notice: still running at the end of the grace, it was sent "
                             f"{self.signal_name} and {_ended(end.returncode)}")
            elif end.returncode not in (0, None):
                lines.append(f"  {who} {_ended(end.returncode)} during the grace")
        return "\n".join(lines)


def _ended(returncode: int | None) -> str:
    """``exited with code 1``, ``was killed by SIGKILL`` (a negative status is a signal)."""
    from launcher.failures.exits import describe_exit

    if returncode is None:
        return "did not end"
    return describe_exit(returncode, None) if returncode >= 0 else describe_exit(None, -returncode)
