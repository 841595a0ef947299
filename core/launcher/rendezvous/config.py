"""The ``--rdzv-conf`` keys of the core's rendezvous: their table, parsing and validation.

Keys keep torchrun's names and defaults so existing command lines work unchanged. Values are
seconds where torchrun has seconds; unlike torchrun, fractions are accepted (``last_call_timeout=0.5``).
A key nobody knows is an error that lists the known keys, because a misspelt timeout silently
falling back to its default is how rendezvous hangs are born.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from launcher.rendezvous.api import RendezvousConfigError, RendezvousParameters

__all__ = [
    "CONFIG_KEYS",
    "ConfigKey",
    "DynamicRendezvousConfig",
    "check_config_keys",
]


@dataclass(frozen=True)
class ConfigKey:
    """One ``--rdzv-conf`` key: its name, value type, default and meaning (one line)."""

    name: str
    #: ``seconds``, ``int``, ``bool``, ``choice`` or ``ignored``.
    type: str
    default: str | None
    help: str
    choices: tuple[str, ...] = ()


#: Every key the core's rendezvous (and so the ``c10d`` backend) understands.
CONFIG_KEYS: Mapping[str, ConfigKey] = {
    key.name: key
    for key in (
        ConfigKey("join_timeout", "seconds", "600", "fail when MIN nodes have not joined within this time"),
        ConfigKey("last_call_timeout", "seconds", "30", "once MIN nodes joined, wait this long for more (up to MAX)"),
        ConfigKey("close_timeout", "seconds", "30", "bound on the store operations that close the rendezvous"),
        ConfigKey("read_timeout", "seconds", "60", "bound on one store operation"),
        ConfigKey("is_host", "bool", None, "whether this node serves the store (default: guessed from the endpoint)"),
        ConfigKey(
            "heartbeat_timeout",
            "seconds",
            None,
            "a participant whose heartbeat is older than this is lost "
            "(default: keep_alive_interval * keep_alive_max_attempt)",
        ),
        ConfigKey("keep_alive_interval", "seconds", "5", "how often each node writes its heartbeat"),
        ConfigKey("keep_alive_max_attempt", "int", "3", "missed heartbeats before a node is lost"),
        ConfigKey("store_type", "choice", "tcp", "the c10d store: tcp (TCPStore) or file (FileStore)", ("tcp", "file")),
        ConfigKey("timeout", "ignored", None, "accepted for torchrun compatibility and ignored"),
        ConfigKey("stable_rank0", "bool", "false", "keep the node that serves the store as group rank 0"),
    )
}


def check_config_keys(config: Mapping[str, str], known: Iterable[str], backend: str = "c10d") -> None:
    """Raise :class:`RendezvousConfigError` naming the first unknown key and listing the known ones."""
    known_set = set(known)
    unknown = sorted(set(config) - known_set)
    if unknown:
        raise RendezvousConfigError(
            f"--rdzv-conf key {unknown[0]!r} is unknown to the {backend} rendezvous; "
            f"known keys: {', '.join(sorted(known_set))}"
        )


@dataclass(frozen=True)
class DynamicRendezvousConfig:
    """Typed, validated settings of the core's rendezvous (all durations in seconds)."""

    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    read_timeout: float = 60.0
    #: ``None``: guess from the endpoint (c10d only).
    is_host: bool | None = None
    keep_alive_interval: float = 5.0
    keep_alive_max_attempt: int = 3
    #: ``None``: ``keep_alive_interval * keep_alive_max_attempt``; see :attr:`liveness_timeout`.
    heartbeat_timeout: float | None = None
    store_type: str = "tcp"
    stable_rank0: bool = False

    def __post_init__(self) -> None:
        for name in ("join_timeout", "last_call_timeout", "close_timeout", "read_timeout", "keep_alive_interval"):
            value = getattr(self, name)
            if not value > 0:
                raise RendezvousConfigError(f"--rdzv-conf {name}={value} must be a positive number of seconds")
        if self.keep_alive_max_attempt < 1:
            raise RendezvousConfigError(
                f"--rdzv-conf keep_alive_max_attempt={self.keep_alive_max_attempt} must be at least 1"
            )
        # A threshold at or below the heartbeat period would call a healthy node lost between
        # two of its heartbeats; refuse it rather than restart jobs at random.
        if self.heartbeat_timeout is not None and not self.heartbeat_timeout > self.keep_alive_interval:
            raise RendezvousConfigError(
                f"--rdzv-conf heartbeat_timeout={self.heartbeat_timeout} must be longer than "
                f"keep_alive_interval={self.keep_alive_interval}, or healthy nodes would look lost"
            )
        if self.store_type not in CONFIG_KEYS["store_type"].choices:
            raise RendezvousConfigError(
                f"--rdzv-conf store_type={self.store_type!r} is not supported: choose "
                + " or ".join(CONFIG_KEYS["store_type"].choices)
            )

    @property
    def liveness_timeout(self) -> float:
        """Seconds without a heartbeat after which a participant counts as lost."""
        if self.heartbeat_timeout is not None:
            return self.heartbeat_timeout
        return self.keep_alive_interval * self.keep_alive_max_attempt

    @classmethod
    def from_parameters(
        cls,
        params: RendezvousParameters,
        *,
        known: Iterable[str] | None = None,
        backend: str | None = None,
    ) -> DynamicRendezvousConfig:
        """Parse ``params.config``.

        ``known`` lists the keys allowed (an unknown one is an error); ``None`` skips that check,
        for a store plugin whose own keys arrive in the same mapping.
        """
        if known is not None:
            check_config_keys(params.config, known, backend or params.backend)
        return cls(
            join_timeout=params.get_as_float("join_timeout", 600.0),
            last_call_timeout=params.get_as_float("last_call_timeout", 30.0),
            close_timeout=params.get_as_float("close_timeout", 30.0),
            read_timeout=params.get_as_float("read_timeout", 60.0),
            is_host=params.get_as_bool("is_host"),
            keep_alive_interval=params.get_as_float("keep_alive_interval", 5.0),
            keep_alive_max_attempt=params.get_as_int("keep_alive_max_attempt", 3),
            heartbeat_timeout=_optional_float(params, "heartbeat_timeout"),
            store_type=(params.get("store_type") or "tcp").strip().lower(),
            stable_rank0=bool(params.get_as_bool("stable_rank0", False)),
        )

    @classmethod
    def from_mapping(cls, config: Mapping[str, str], *, known: Iterable[str] | None = None) -> DynamicRendezvousConfig:
        """Parse a plain ``{key: value}`` mapping (``--rdzv-conf`` already split)."""
        params = RendezvousParameters(
            backend="c10d", endpoint="", run_id="", min_nodes=1, max_nodes=1, config=dict(config)
        )
        return cls.from_parameters(params, known=known)


def _optional_float(params: RendezvousParameters, key: str) -> float | None:
    if not params.get(key):
        return None
    return params.get_as_float(key, 0.0)
