"""The rendezvous key schema: the name of every store key the core's rendezvous uses.

This module is a public contract (see "Keys" in docs/rendezvous.md). A store backend may rely
on it to recognise the keys it is asked to hold, for example to tie a node's own keys to that
node's life (``launcher-etcd`` attaches them to the node's lease): :func:`parse_key` turns a key
back into its :class:`KeyKind`, round and index, and :func:`is_per_node` says whether only the
node it describes writes it. :class:`RendezvousKeys` builds the names for one run. The names
themselves are the wire format: they do not change without a note in docs/rendezvous.md.

Layout, below ``KEY_ROOT/<run id, URL-quoted>/``::

    current  closed                                    (one per job)
    <r>/open  <r>/seq  <r>/sealed  <r>/rejoin          (one per round r)
    <r>/roster  <r>/lost  <r>/master
    <r>/node/<join index>  <r>/place/<join index>      (one per node of round r)
    <r>/hb/<group rank>
    <r>/tally  <r>/checks                              (--segment only)
    <r>/segs  <r>/dom/<domain number>                  (--segment, beyond MAX nodes only)
    <r>/lost/<report number>                           (one per lost-node report)
    <r>/agent/<anything>                               (the agents' own keys for round r)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from urllib.parse import quote, unquote

__all__ = [
    "KEY_ROOT",
    "PER_NODE_KINDS",
    "KeyKind",
    "ParsedKey",
    "RendezvousKeys",
    "is_per_node",
    "parse_key",
]

#: Every key of the core's rendezvous starts with ``KEY_ROOT/<quoted run id>/``.
KEY_ROOT = "launcher/rdzv"


class KeyKind(str, enum.Enum):
    """What a key is for."""

    #: The newest round number, or ``closed`` once the job has ended (one per job).
    CURRENT = "current"
    #: Set when the job has ended; its value says why (one per job).
    CLOSED = "closed"
    #: Round ``r`` has been opened: wakes the nodes waiting for it.
    OPEN = "open"
    #: Join-order counter of round ``r``.
    SEQ = "seq"
    #: Participant record of the node with join index ``index``.
    NODE = "node"
    #: The outcome of round ``r`` (sealed, aborted or closed), written once: a small record.
    SEALED = "sealed"
    #: The full participants list of a sealed round ``r`` (ids, local world sizes, addresses),
    #: written by its closer; read only by the nodes that need it.
    ROSTER = "roster"
    #: The place (group rank, or none) of the node with join index ``index`` in a sealed round.
    PLACE = "place"
    #: Counter of participants that left round ``r`` to join a new one.
    REJOIN = "rejoin"
    #: Heartbeat counter of the participant with group rank ``index``.
    HEARTBEAT = "heartbeat"
    #: Counter of lost-node reports in round ``r``.
    LOST_COUNT = "lost_count"
    #: Lost-node report number ``index`` (its value is a node id).
    LOST = "lost"
    #: Where group rank 0 serves the workers' store in round ``r``.
    MASTER = "master"
    #: Below this, the agents' own keys for round ``r`` (``RendezvousInfo.store``).
    AGENT = "agent"
    #: ``--segment``: counter of the whole segments completed by nodes that joined round ``r``
    #: beyond MAX (the first MAX nodes are counted in ``TALLY``).
    SEGMENTS = "segments"
    #: ``--segment``: counter of the nodes of one domain (``index``: its number) that joined
    #: round ``r`` beyond MAX.
    DOMAIN = "domain"
    #: ``--segment``: the first MAX nodes of round ``r`` counted per domain, and the whole segments
    #: they make; written once, by the node with join index MAX.
    TALLY = "tally"
    #: ``--segment``: the last check of a round's closer that found fewer than MIN nodes in whole
    #: segments (a backup closer sees it change while the closer lives).
    CHECKS = "checks"


#: Keys that only the node they describe writes: its participant record and heartbeat counter.
#: Every other key is shared (any node may write it) and must outlive the node that wrote it.
PER_NODE_KINDS = frozenset({KeyKind.NODE, KeyKind.HEARTBEAT})

# The last name segment of each kind of key: per job, per round, and per round and index.
_JOB_KINDS = {"current": KeyKind.CURRENT, "closed": KeyKind.CLOSED}
_ROUND_KINDS = {
    "open": KeyKind.OPEN,
    "seq": KeyKind.SEQ,
    "sealed": KeyKind.SEALED,
    "roster": KeyKind.ROSTER,
    "rejoin": KeyKind.REJOIN,
    "lost": KeyKind.LOST_COUNT,
    "master": KeyKind.MASTER,
    "segs": KeyKind.SEGMENTS,
    "tally": KeyKind.TALLY,
    "checks": KeyKind.CHECKS,
}
_INDEXED_KINDS = {"node": KeyKind.NODE, "place": KeyKind.PLACE, "hb": KeyKind.HEARTBEAT, "lost": KeyKind.LOST,
                  "dom": KeyKind.DOMAIN}
_AGENT = "agent"


@dataclass(frozen=True)
class ParsedKey:
    """A rendezvous key taken apart by :func:`parse_key`."""

    kind: KeyKind
    #: The round number; ``None`` for the per-job keys (``current``, ``closed``).
    round: int | None
    #: Join index (``NODE``, ``PLACE``), group rank (``HEARTBEAT``) or report number (``LOST``);
    #: else ``None``.
    index: int | None
    #: The run id, unquoted.
    run_id: str


class RendezvousKeys:
    """The key names of one run (``run_id`` is the job's ``--rdzv-id``)."""

    def __init__(self, run_id: str) -> None:
        # Quoting keeps a run id containing "/" from reaching into another run's keys.
        self.base = f"{KEY_ROOT}/{quote(run_id, safe='')}"
        #: Every key of the run starts with this.
        self.run_prefix = f"{self.base}/"
        #: Set once the job has ended.
        self.closed = f"{self.base}/closed"
        #: The newest round number, or ``closed``.
        self.current = f"{self.base}/current"

    def round_prefix(self, r: int) -> str:
        """Every key of round ``r`` starts with this."""
        return f"{self.base}/{r}/"

    def open(self, r: int) -> str:
        """``<r>/open``: round ``r`` has been opened (or, ``closed``, will never be)."""
        return f"{self.base}/{r}/open"

    def seq(self, r: int) -> str:
        """``<r>/seq``: round ``r``'s join-order counter."""
        return f"{self.base}/{r}/seq"

    def node(self, r: int, index: int) -> str:
        """``<r>/node/<index>``: the participant record of join index ``index``."""
        return f"{self.base}/{r}/node/{index}"

    def node_prefix(self, r: int) -> str:
        """Every participant record of round ``r`` starts with this."""
        return f"{self.base}/{r}/node/"

    def sealed(self, r: int) -> str:
        """``<r>/sealed``: round ``r``'s outcome."""
        return f"{self.base}/{r}/sealed"

    def roster(self, r: int) -> str:
        """``<r>/roster``: the participants of sealed round ``r``, in group-rank order."""
        return f"{self.base}/{r}/roster"

    def place(self, r: int, index: int) -> str:
        """``<r>/place/<index>``: where the node of join index ``index`` stands in sealed round ``r``."""
        return f"{self.base}/{r}/place/{index}"

    def rejoin(self, r: int) -> str:
        """``<r>/rejoin``: how many participants left round ``r`` to join a new one."""
        return f"{self.base}/{r}/rejoin"

    def heartbeat(self, r: int, rank: int) -> str:
        """``<r>/hb/<rank>``: the heartbeat counter of group rank ``rank``."""
        return f"{self.base}/{r}/hb/{rank}"

    def heartbeat_prefix(self, r: int) -> str:
        """Every heartbeat counter of round ``r`` starts with this."""
        return f"{self.base}/{r}/hb/"

    def lost_count(self, r: int) -> str:
        """``<r>/lost``: how many lost-node reports round ``r`` has."""
        return f"{self.base}/{r}/lost"

    def lost(self, r: int, k: int) -> str:
        """``<r>/lost/<k>``: lost-node report number ``k`` (1, 2, ...)."""
        return f"{self.base}/{r}/lost/{k}"

    def master(self, r: int) -> str:
        """``<r>/master``: where round ``r``'s workers' store is served."""
        return f"{self.base}/{r}/master"

    def segments(self, r: int) -> str:
        """``<r>/segs`` (``--segment``): how many whole segments the nodes that joined round ``r``
        beyond MAX completed."""
        return f"{self.base}/{r}/segs"

    def domain(self, r: int, number: int) -> str:
        """``<r>/dom/<number>`` (``--segment``): how many nodes of domain ``number`` joined round
        ``r`` beyond MAX."""
        return f"{self.base}/{r}/dom/{number}"

    def tally(self, r: int) -> str:
        """``<r>/tally`` (``--segment``): the first MAX nodes of round ``r`` per domain and their
        whole segments (``{"dom": {number: nodes}, "whole": segments}``)."""
        return f"{self.base}/{r}/tally"

    def checks(self, r: int) -> str:
        """``<r>/checks`` (``--segment``): round ``r``'s closer's last check for MIN nodes in whole
        segments (``{"by": node id, "n": check number, "count": joined, "whole": in whole segments}``)."""
        return f"{self.base}/{r}/checks"

    def agent(self, r: int) -> str:
        """The prefix of the agents' own keys for round ``r``."""
        return f"{self.base}/{r}/agent/"


def _number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def parse_key(key: str) -> ParsedKey | None:
    """``key`` taken apart, or ``None`` if it is not a key of the core's rendezvous (any run)."""
    if not key.startswith(KEY_ROOT + "/"):
        return None
    run, *path = key[len(KEY_ROOT) + 1 :].split("/")
    if not run or not path:
        return None
    run_id = unquote(run)
    if len(path) == 1:
        kind = _JOB_KINDS.get(path[0])
        return ParsedKey(kind, None, None, run_id) if kind is not None else None
    r = _number(path[0])
    if r is None:
        return None
    if path[1] == _AGENT and len(path) >= 3:
        return ParsedKey(KeyKind.AGENT, r, None, run_id)
    if len(path) == 2:
        kind = _ROUND_KINDS.get(path[1])
        return ParsedKey(kind, r, None, run_id) if kind is not None else None
    if len(path) == 3:
        kind = _INDEXED_KINDS.get(path[1])
        index = _number(path[2])
        if kind is not None and index is not None:
            return ParsedKey(kind, r, index, run_id)
    return None


def is_per_node(key: str) -> bool:
    """Whether only the node ``key`` describes writes it (see :data:`PER_NODE_KINDS`)."""
    parsed = parse_key(key)
    return parsed is not None and parsed.kind in PER_NODE_KINDS
