"""Departures: the one record of "node X left round r, or was put out of it, and why".

Whatever finds that a participant is gone (the heartbeat ring of :mod:`~launcher.rendezvous.liveness`,
the c10d store seeing an agent's connection close, :mod:`~launcher.rendezvous.disconnects`), and
whatever will decide to put a node out later (a failed health check, a straggler), publishes it
here with :func:`report_departure`, and nowhere else. Publishing is also the re-form trigger: every
participant's membership check (``lost_nodes()``, read by the agent at each poll) sees the report
at its next read, stops its workers and joins the next round, where a spare, if one waits, takes
the departed node's place. See "Departures" in docs/rendezvous.md.

A report is two store operations: ``add(<r>/lost, 1)`` takes a report number ``k``, then
``<r>/lost/<k>`` is set to the report, ``{"id": node, "why": reason}`` in JSON (a bare node id,
as written before reasons existed, reads as a report without a reason). Reports are never
rewritten; a node reported twice (by its watcher and by the store) is named once.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass

from launcher.rendezvous.keys import RendezvousKeys
from launcher.rendezvous.store_ops import StoreOps
from launcher.store.api import StoreTimeoutError

__all__ = [
    "AGENT_DIED",
    "HEARTBEAT_TIMEOUT",
    "UNREACHABLE",
    "STRAGGLER",
    "Departure",
    "LostNodes",
    "decode_report",
    "describe",
    "encode_report",
    "report_departure",
]

log = logging.getLogger("launcher.rendezvous")

#: Why a node whose agent's store connection closed without leaving the round is gone.
AGENT_DIED = "agent process died"
#: Why a node whose heartbeat stopped for longer than the heartbeat timeout is gone. The weakest
#: evidence: a paused agent (SIGSTOP, a frozen VM) stops beating while its workers run on, so a
#: later report with another reason (its connection closed, or timed out) replaces this one.
HEARTBEAT_TIMEOUT = "heartbeat timeout"
#: Why a node whose host stopped answering at the network level is gone: its agent's store
#: connection timed out (TCP keep-alive probes unanswered: a pulled cable, a powered-off host).
UNREACHABLE = "its host stopped answering (store connection timed out)"
#: How the reason of a node put out as a straggler starts (launcher.stragglers.exclusion): the
#: others did not lose contact with it, the job decided to go on without it.
STRAGGLER = "straggler: "


@dataclass(frozen=True)
class Departure:
    """A participant that is gone from its round: its node id and why (``""``: not said)."""

    node: str
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.node} ({self.reason})" if self.reason else self.node


def encode_report(node: str, reason: str) -> bytes:
    """The stored form of a departure report."""
    return json.dumps({"id": node, "why": reason}, separators=(",", ":")).encode()


def decode_report(raw: bytes) -> Departure:
    """A stored report back as a :class:`Departure` (a bare node id: no reason)."""
    text = raw.decode("utf-8", "replace")
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            return Departure(text)
        if isinstance(value, dict) and isinstance(value.get("id"), str):
            return Departure(value["id"], str(value.get("why") or ""))
    return Departure(text)


def report_departure(ops: StoreOps, keys: RendezvousKeys, r: int, node: str, reason: str) -> int:
    """Publish that ``node`` is gone from round ``r`` because of ``reason``; the report's number.

    Every participant of round ``r`` learns it at its next membership check and re-forms
    without it. Raises what the store raises (the caller decides whether that matters).
    """
    k = ops.add(keys.lost_count(r), 1)
    ops.set(keys.lost(r, k), encode_report(node, reason))
    return k


def describe(departures: list[Departure] | list[str], reasons: dict[str, str] | None = None) -> str:
    """``a (why), b (why)``: departed nodes as messages name them."""
    parts = []
    for item in departures:
        if isinstance(item, Departure):
            parts.append(str(item))
        else:
            parts.append(str(Departure(item, (reasons or {}).get(item, ""))))
    return ", ".join(parts)


class LostNodes:
    """The departure reports of this node's round, as far as it has read them."""

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._why: dict[str, str] = {}
        self._read = 0
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget every report (a new round starts)."""
        with self._lock:
            self._ids, self._why, self._read = [], {}, 0

    def record(self, node_id: str, reason: str = "") -> None:
        """Note ``node_id`` as gone (a report this node made, or read); the first reason given
        stays, but for :data:`HEARTBEAT_TIMEOUT`, which a firmer one replaces."""
        with self._lock:
            if node_id not in self._ids:
                self._ids.append(node_id)
            if reason and self._why.get(node_id, HEARTBEAT_TIMEOUT) == HEARTBEAT_TIMEOUT:
                self._why[node_id] = reason

    def reasons(self) -> dict[str, str]:
        """Node id -> why it is gone, for the nodes read so far whose report says why."""
        with self._lock:
            return dict(self._why)

    def read(self, ops: StoreOps, keys: RendezvousKeys, r: int) -> list[str]:
        """Every participant of round ``r`` reported gone: one store read while nothing new is."""
        count = ops.add(keys.lost_count(r), 0)
        if count > self._read:
            try:
                records = ops.multi_get([keys.lost(r, k) for k in range(self._read + 1, count + 1)], 1.0)
            except StoreTimeoutError:
                records = []  # a reporter is between counting and naming: read again next time
            else:
                self._read = count
            for raw in records:
                report = decode_report(raw)
                self.record(report.node, report.reason)
        with self._lock:
            return list(self._ids)
