"""The agent's view of the straggler file: one slot per local worker (layout in :mod:`launcher.stragglers.timing`).

A :class:`TimingTable` is created zeroed before the workers start and mapped read-only; each
:meth:`~TimingTable.read_all` is one consistent copy of the whole file (64 bytes a rank).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from launcher.slot_table import SlotTable
from launcher.stragglers.timing import SLOT_SIZE

_SLOT = struct.Struct("<ddqqqdqq")


class RankTotals(NamedTuple):
    """One rank's running totals, as its worker last wrote them."""

    #: Seconds in finished collectives.
    wait: float
    #: CLOCK_MONOTONIC start of the collective in progress (0: none).
    entered: float
    #: Collectives finished.
    collectives: int
    #: Last step given to ``launcher.heartbeat(step)`` (meaningless while ``steps`` is 0).
    step: int
    #: ``heartbeat(step)`` calls.
    steps: int
    #: CLOCK_MONOTONIC of the last one.
    step_time: float
    #: Of ``collectives``, those timed on the GPU's timeline (CUDA events: NCCL, gloo on CUDA tensors).
    gpu_collectives: int = 0
    #: Collectives timed on the GPU, queued, whose events the GPU has not reached yet.
    gpu_pending: int = 0

    def wait_at(self, now: float) -> float:
        """Seconds in collectives up to ``now``, the one in progress included."""
        return self.wait + (max(0.0, now - self.entered) if self.entered else 0.0)

    @property
    def clock(self) -> str:
        """What timed this rank's collectives: ``"gpu"``, ``"host"``, ``"both"`` or ``""`` (none yet)."""
        gpu = self.gpu_collectives > 0 or self.gpu_pending > 0
        host = self.collectives > self.gpu_collectives or self.entered > 0
        return "both" if gpu and host else "gpu" if gpu else "host" if host else ""

    @property
    def active(self) -> bool:
        """Whether the rank has measured anything yet (a collective, or a step)."""
        return self.collectives > 0 or self.entered > 0 or self.steps > 0 or self.gpu_pending > 0


class TimingTable(SlotTable):
    """The straggler file of one attempt: ``count`` zeroed slots, mapped by the agent."""

    def __init__(self, path: str, count: int) -> None:
        super().__init__(path, count, SLOT_SIZE)

    def read_all(self) -> list[RankTotals]:
        """Every slot, from one consistent copy of the table."""
        data = self.copy()
        return [RankTotals(*_SLOT.unpack_from(data, index * SLOT_SIZE)) for index in range(self.count)]
