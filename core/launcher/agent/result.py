"""What the agent loop sees while its workers run, and how the job ended on this node."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from launcher.failures.report import FailureReport, WorkerFailure

__all__ = ["AgentResult", "WatchOutcome"]


class WatchOutcome(enum.Enum):
    """Why watching a worker group stopped: what the agent loop must do next."""

    #: Every worker exited with status 0.
    SUCCEEDED = "succeeded"
    #: A worker exited with a non-zero status or died of a signal.
    FAILED = "failed"
    #: A rank made no progress for ``--hang-timeout`` seconds.
    HUNG = "hung"
    #: Nodes are waiting to join, or a node was lost: re-form the group.
    MEMBERSHIP = "membership"
    #: The agent received a signal it forwards.
    SIGNAL = "signal"
    #: Another node ended the job (closed the rendezvous).
    CLOSED = "closed"
    #: The rendezvous store is gone.
    STORE_GONE = "store"
    #: The job is being preempted (a preemption signal here, or another node's notice).
    PREEMPTED = "preempted"


@dataclass
class AgentResult:
    """How the job ended on this node."""

    exit_code: int
    #: Return values of function entrypoints, by global rank.
    return_values: dict[int, Any] = field(default_factory=dict)
    failures: list[WorkerFailure] = field(default_factory=list)
    report: FailureReport | None = None
    message: str = ""
    #: The job was preempted (``message`` is the preemption report; not a failure).
    preempted: bool = False
