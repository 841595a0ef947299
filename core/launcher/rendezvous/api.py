"""The rendezvous interface between the agent and a backend.

A backend plugin returns a :class:`RendezvousHandler` (or only a store, and the core's own
algorithm supplies the handler). The agent calls :meth:`RendezvousHandler.next_rendezvous` before
each start of its workers, polls :meth:`~RendezvousHandler.num_nodes_waiting` and
:meth:`~RendezvousHandler.lost_nodes` while they run, and closes the rendezvous when the job ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from launcher.errors import LaunchError, UsageError
from launcher.store.api import StoreError
from launcher.values import quote, read_float, read_int

if TYPE_CHECKING:  # pragma: no cover
    from launcher.store.api import KeyValueStore


class RendezvousError(LaunchError):
    """The rendezvous failed; the message says why and with whom."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous was closed (the job finished or failed elsewhere)."""


class RendezvousTimeoutError(RendezvousError):
    """Not enough nodes joined in time."""


class RendezvousStoreError(RendezvousError):
    """A call to the rendezvous store failed (it refused, closed or cut off the connection): the
    agent then asks whether the store is gone before writing anything more to it."""


#: What a call to the rendezvous store raises when the store, or the way to it, fails: the
#: store's own error, the rendezvous' (a closed or cut connection), or the socket's. Callers
#: that catch these have a safe answer for "cannot tell".
STORE_FAILURES: tuple[type[Exception], ...] = (StoreError, RendezvousError, OSError)


#: Rounds of up to this many nodes are small: each node may read the whole roster (every
#: participant's name and ranks, O(N) bytes) as soon as the round forms, for the
#: ``rendezvous_completed`` event's participants and to name nodes at the exit barrier. In
#: larger rounds a node reads it only when it must name another node (see "What a node reads"
#: in docs/rendezvous.md).
SMALL_ROUND_MAX = 256


class RendezvousConfigError(UsageError):
    """Invalid ``--rdzv-*`` settings."""


_N = TypeVar("_N", int, float)

_TRUE = {"1", "true", "yes", "on", "t", "y"}
_FALSE = {"0", "false", "no", "off", "f", "n"}


@dataclass
class RendezvousParameters:
    """Everything the command line says about the rendezvous."""

    backend: str
    endpoint: str
    run_id: str
    min_nodes: int
    max_nodes: int
    local_addr: str | None = None
    config: dict[str, str] = field(default_factory=dict)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.config.get(key, default)

    def get_as_int(self, key: str, default: int) -> int:
        """``key`` as an ASCII decimal integer; ``default`` when absent or empty."""
        return self._number(key, default, read_int, "an integer")

    def get_as_float(self, key: str, default: float) -> float:
        """``key`` as a finite number (ASCII); ``default`` when absent or empty."""
        return self._number(key, default, read_float, "a finite number")

    def _number(self, key: str, default: _N, read: Callable[[str], _N | None], what: str) -> _N:
        value = self.config.get(key)
        if value is None or value == "":
            return default
        number = read(value)
        if number is None:
            raise RendezvousConfigError(f"--rdzv-conf {key}={quote(value)} must be {what}")
        return number

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        value = self.config.get(key)
        if value is None or value == "":
            return default
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise RendezvousConfigError(f"--rdzv-conf {key}={value!r} must be true or false (or 1 or 0)")


@dataclass
class RendezvousInfo:
    """The outcome of one rendezvous round, for this node."""

    #: A store shared by every agent of this round (the agent uses it for rank assignment and
    #: the exit barrier); ``None`` for a single-node rendezvous, which needs none.
    store: KeyValueStore | None
    group_rank: int
    group_world_size: int
    #: Where the workers' store is served (``MASTER_ADDR``/``MASTER_PORT`` of the workers).
    master_addr: str
    master_port: int
    #: Whether workers connect to the store the agent serves (``TORCHELASTIC_USE_AGENT_STORE``).
    use_agent_store: bool = True
    round: int = 0
    #: Node ids of every participant, in group-rank order, when the backend knows them. The
    #: core's rendezvous reads them from the store on first use (a
    #: :class:`~launcher.rendezvous.membership.Roster`): its length and this node's own entry
    #: (``participants[group_rank]``) cost nothing, anything more O(N) bytes, once.
    participants: Sequence[str] = field(default_factory=list)
    #: Each participant's local world size, in group-rank order (for global rank offsets); read
    #: on first use like ``participants``.
    local_world_sizes: Sequence[int] = field(default_factory=list)
    #: The nodes of round ``round - 1`` that are not in this one, when the backend knows them
    #: without reading both rounds' lists (the core's rendezvous: the round's closer names
    #: them, up to :data:`SMALL_ROUND_MAX`, in the small record every node reads), and how
    #: many they are in all. ``None``: not known (the agent compares ``participants`` then).
    left: Sequence[str] | None = None
    left_count: int = 0


class FixedMembership:
    """What a rendezvous whose nodes never change answers while workers run.

    For handlers of a fixed set of nodes (single-node, static): no node ever waits to join or
    goes missing, and closing only marks this node done. Set ``_run_id`` and ``_closed``.
    """

    _run_id: str
    _closed: bool = False

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        return 0

    def lost_nodes(self) -> list[str]:
        return []

    def get_run_id(self) -> str:
        return self._run_id


@runtime_checkable
class RendezvousHandler(Protocol):
    """What the agent needs from a rendezvous."""

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and return this node's place in it."""

    def is_closed(self) -> bool:
        """Whether the job is over (no further rounds)."""

    def set_closed(self) -> None:
        """End the job for every node: late arrivals exit instead of waiting."""

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join a new round (a scale-up opportunity)."""

    def lost_nodes(self) -> list[str]:
        """Participants of the current round that stopped responding (empty when all are fine)."""

    def get_run_id(self) -> str:
        """The job id all nodes share."""

    def shutdown(self) -> bool:
        """Release this node's resources (heartbeat threads, served stores)."""


@runtime_checkable
class StoreBackedHandler(RendezvousHandler, Protocol):
    """A handler whose rounds live in a key-value store, and that can say when the store is gone.

    Optional: the agent asks a handler that implements it, when a store call fails, whether the
    store is gone (its host died) rather than slow, and then leaves without writing to it.
    """

    def store_problem(self, timeout: float = 2.0) -> str | None:
        """Why the store cannot be reached (a fresh connect fails), or ``None`` when it can."""

    def store_location(self) -> str:
        """Where the store is, as messages name it (``the rendezvous store on host:port``)."""

    def abandon_store(self) -> None:
        """The store is gone: :meth:`shutdown` then writes nothing to it."""

    def node_address(self) -> str | None:
        """The address this node announced to the others, if any."""
