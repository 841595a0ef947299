"""The ``--rdzv-conf`` keys of the core's rendezvous: their table, parsing and validation.

Keys keep torchrun's names and defaults so existing command lines work unchanged. Values are
seconds where torchrun has seconds; unlike torchrun, fractions are accepted (``last_call_timeout=0.5``).
A key nobody knows is an error that lists the known keys, because a misspelt timeout silently
falling back to its default is how rendezvous hangs are born.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from launcher.errors import UsageError
from launcher.rendezvous.api import RendezvousConfigError, RendezvousParameters
from launcher.store.admission import Admission, parse_networks
from launcher.values import parse_int, parse_seconds, quote

#: Missed heartbeats before a node is lost: at most this many (more is a typo, not a policy).
MAX_KEEP_ALIVE_ATTEMPTS = 1000

__all__ = [
    "CONFIG_KEYS",
    "ConfigKey",
    "SECRET_ENV",
    "DynamicRendezvousConfig",
    "check_config_keys",
    "check_core_values",
    "store_admission",
]


@dataclass(frozen=True)
class ConfigKey:
    """One ``--rdzv-conf`` key: its name, value type, default and meaning (one line)."""

    name: str
    #: ``seconds``, ``int``, ``bool``, ``choice``, ``networks``, ``path`` or ``ignored``.
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
        ConfigKey("timeout", "ignored", None, "accepted for torchrun compatibility and ignored (still seconds)"),
        ConfigKey("stable_rank0", "bool", "false", "keep the node that serves the store as group rank 0"),
        ConfigKey(
            "join_networks",
            "networks",
            None,
            "only hosts in these ';'-separated CIDR ranges may join (e.g. 10.0.0.0/8;fd00::/8)",
        ),
        ConfigKey(
            "secret_file",
            "path",
            None,
            "file holding the shared secret joining agents must prove (or set LAUNCHER_RDZV_SECRET)",
        ),
    )
}


def check_config_keys(config: Mapping[str, str], known: Iterable[str], backend: str = "c10d") -> None:
    """Raise :class:`RendezvousConfigError` naming the first unknown key and listing the known ones."""
    known_set = set(known)
    unknown = sorted(set(config) - known_set)
    if unknown:
        raise RendezvousConfigError(
            f"--rdzv-conf key {quote(unknown[0])} is unknown to the {backend} rendezvous; "
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
    #: Who may use the agent's store while a round is open; ``None``: anyone (see docs/store-security.md).
    store_admission: Admission | None = None

    def __post_init__(self) -> None:
        for name in ("join_timeout", "last_call_timeout", "close_timeout", "read_timeout", "keep_alive_interval"):
            _check_seconds(getattr(self, name), name)
        if self.heartbeat_timeout is not None:
            _check_seconds(self.heartbeat_timeout, "heartbeat_timeout")
        _attempts(self.keep_alive_max_attempt)
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
        # Ignored by c10d, read as join_timeout by etcd: seconds either way, checked under its own
        # name first (a nonsense value is a typo wherever it goes).
        _optional_float(params, "timeout")
        return cls(
            join_timeout=_seconds(params, "join_timeout", 600.0),
            last_call_timeout=_seconds(params, "last_call_timeout", 30.0),
            close_timeout=_seconds(params, "close_timeout", 30.0),
            read_timeout=_seconds(params, "read_timeout", 60.0),
            is_host=params.get_as_bool("is_host"),
            keep_alive_interval=_seconds(params, "keep_alive_interval", 5.0),
            keep_alive_max_attempt=_attempts(params.get("keep_alive_max_attempt") or "3"),
            heartbeat_timeout=_optional_float(params, "heartbeat_timeout"),
            store_type=(params.get("store_type") or "tcp").strip().lower(),
            stable_rank0=bool(params.get_as_bool("stable_rank0", False)),
            store_admission=store_admission(params.config),
        )

    @classmethod
    def from_mapping(cls, config: Mapping[str, str], *, known: Iterable[str] | None = None) -> DynamicRendezvousConfig:
        """Parse a plain ``{key: value}`` mapping (``--rdzv-conf`` already split)."""
        params = RendezvousParameters(
            backend="c10d", endpoint="", run_id="", min_nodes=1, max_nodes=1, config=dict(config)
        )
        return cls.from_parameters(params, known=known)


def _check_seconds(value: float | str, key: str) -> float:
    """``value`` as seconds above 0 and at most a week, else :class:`RendezvousConfigError`."""
    try:
        return parse_seconds(value, f"--rdzv-conf {key}", zero=False)
    except UsageError as exc:
        raise RendezvousConfigError(str(exc)) from None


# An empty value means "not given" here, as in RendezvousParameters.get_as_*; the command line
# refuses `key=` before it gets here (launcher.config.parse_rdzv_conf).
def _seconds(params: RendezvousParameters, key: str, default: float) -> float:
    value = params.get(key)
    return default if value is None or value == "" else _check_seconds(value, key)


def _attempts(value: int | str | None) -> int:
    try:
        return parse_int(value, "--rdzv-conf keep_alive_max_attempt", 1, MAX_KEEP_ALIVE_ATTEMPTS)
    except UsageError as exc:
        raise RendezvousConfigError(str(exc)) from None


def check_core_values(config: Mapping[str, str]) -> None:
    """Check the values of the core's keys present in ``config``, whatever else it holds.

    For backends that accept any key (torch's ``torchrun.handlers``): a key that means the same
    there (``join_timeout``, ``read_timeout``...) is still refused when its value is nonsense.
    """
    params = RendezvousParameters(
        backend="c10d", endpoint="", run_id="", min_nodes=1, max_nodes=1,
        config={key: value for key, value in config.items() if key in CONFIG_KEYS},
    )
    DynamicRendezvousConfig.from_parameters(params)


def _optional_float(params: RendezvousParameters, key: str) -> float | None:
    value = params.get(key)
    return None if value is None or value == "" else _check_seconds(value, key)


# ---------------------------------------------------------------------- store admission

#: Environment variable holding the store's shared secret (never on the command line, where
#: every local user can read it in ``ps``).
SECRET_ENV = "LAUNCHER_RDZV_SECRET"
_MIN_SECRET_LEN = 16


def store_admission(config: Mapping[str, str], environ: Mapping[str, str] | None = None) -> Admission | None:
    """The store's :class:`~launcher.store.admission.Admission` from ``join_networks``,
    ``secret_file`` and :data:`SECRET_ENV`; ``None`` when none is set.

    ``join_networks`` separates ranges with ``;`` (``,`` already separates ``--rdzv-conf``
    items). Raises :class:`RendezvousConfigError` with one line for a bad range, an unreadable,
    empty, short or world-readable secret file, or a secret given both ways.
    """
    environ = os.environ if environ is None else environ
    networks_text = (config.get("join_networks") or "").strip()
    networks = [part for part in networks_text.split(";") if part.strip()]
    try:
        parsed = parse_networks(networks)
    except ValueError as exc:
        raise RendezvousConfigError(f"--rdzv-conf join_networks: {exc}") from None
    if networks_text and not parsed:
        raise RendezvousConfigError("--rdzv-conf join_networks is empty")
    secret_file = (config.get("secret_file") or "").strip()
    env_secret = environ.get(SECRET_ENV, "")
    if secret_file and env_secret:
        raise RendezvousConfigError(
            f"give the store secret either as --rdzv-conf secret_file or as {SECRET_ENV}, not both"
        )
    secret: bytes | None = None
    if secret_file:
        secret = _read_secret_file(secret_file)
    elif env_secret:
        secret = env_secret.strip().encode("utf-8")
        if len(secret) < _MIN_SECRET_LEN:
            raise RendezvousConfigError(
                f"{SECRET_ENV} is shorter than {_MIN_SECRET_LEN} bytes; use e.g. `openssl rand -hex 32`"
            )
    if not parsed and secret is None:
        return None
    return Admission(join_networks=parsed, secret=secret)


def _read_secret_file(path: str) -> bytes:
    where = f"--rdzv-conf secret_file={path}"
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            data = fh.read(1 << 16).strip()
    except OSError as exc:
        raise RendezvousConfigError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        raise RendezvousConfigError(f"{where}: not a regular file")
    if mode & stat.S_IROTH:
        raise RendezvousConfigError(f"{where}: every user can read it; run chmod o-r on it")
    if len(data) < _MIN_SECRET_LEN:
        raise RendezvousConfigError(
            f"{where}: the secret is shorter than {_MIN_SECRET_LEN} bytes; use e.g. `openssl rand -hex 32`"
        )
    return data
