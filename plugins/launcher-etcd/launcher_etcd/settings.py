"""The etcd backend's ``--rdzv-conf`` keys and ``--rdzv-endpoint``: their table, parsing, validation.

Cheap to import (the plugin module imports it to list the keys): only the standard library and
the core's own configuration module. torchrun's names are accepted where torchrun had the same
setting: its ``etcd-v2`` backend spells TLS ``ca_cert``/``ssl_cert``/``ssl_cert_key`` and its
legacy ``etcd`` backend ``cacert``/``cert``/``key``; both spellings mean the same here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

from launcher.errors import UsageError
from launcher.rendezvous.api import RendezvousConfigError, RendezvousParameters
from launcher.rendezvous.config import CONFIG_KEYS as CORE_CONFIG_KEYS
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.endpoint import check_resolvable, parse_endpoint
from launcher.values import parse_seconds
from launcher.values import quote as quote_value

from launcher_etcd.plugin import CORE_KEYS_LEFT_OUT

__all__ = [
    "ALL_CONFIG_KEYS",
    "CORE_KEYS",
    "DEFAULT_PORT",
    "ETCD_KEYS",
    "Endpoint",
    "EtcdKey",
    "EtcdSettings",
    "check_parameters",
    "default_lease_ttl",
    "effective_parameters",
    "rendezvous_config",
]

#: etcd's client port, also torchrun's default for its etcd backends.
DEFAULT_PORT = 2379
#: Environment fallbacks for the credentials, so that a password need not appear in ``ps``.
USERNAME_ENV = "LAUNCHER_ETCD_USERNAME"
PASSWORD_ENV = "LAUNCHER_ETCD_PASSWORD"


@dataclass(frozen=True)
class EtcdKey:
    """One ``--rdzv-conf`` key of this backend: its name, default, meaning and torchrun spelling."""

    name: str
    default: str | None
    help: str
    #: The canonical key this one is another spelling of (``ca_cert`` -> ``cacert``).
    alias_of: str | None = None
    #: Which torchrun backend knew this key (``etcd``, ``etcd-v2``, both), for the docs.
    torchrun: str = ""


#: The keys only this backend knows (the core's rendezvous keys come on top, see CORE_KEYS).
ETCD_KEYS: Mapping[str, EtcdKey] = {
    key.name: key
    for key in (
        EtcdKey("protocol", "http", "http or https; https when a TLS file is given", torchrun="etcd, etcd-v2"),
        EtcdKey("cacert", None, "CA bundle that signed etcd's server certificate", torchrun="etcd"),
        EtcdKey("ca_cert", None, "same as cacert", alias_of="cacert", torchrun="etcd-v2"),
        EtcdKey("cert", None, "client certificate (PEM), for etcd's --client-cert-auth", torchrun="etcd"),
        EtcdKey("ssl_cert", None, "same as cert", alias_of="cert", torchrun="etcd-v2"),
        EtcdKey("key", None, "private key of the client certificate (PEM)", torchrun="etcd"),
        EtcdKey("ssl_cert_key", None, "same as key", alias_of="key", torchrun="etcd-v2"),
        EtcdKey("username", None, f"etcd user (auth enabled); else ${USERNAME_ENV}"),
        EtcdKey("password", None, f"that user's password; else ${PASSWORD_ENV} (keeps it out of ps)"),
        EtcdKey("etcd_prefix", "/launcher/<run_id>/", "key prefix of this job in etcd", torchrun="etcd"),
        EtcdKey(
            "lease_ttl",
            "1.5 x (heartbeat timeout + 1 s)",
            "seconds a dead node's keys outlive it (its lease's time to live)",
        ),
    )
}

#: The core's rendezvous keys that mean something over etcd. ``store_type`` and ``is_host``
#: choose and serve a c10d store, which has no meaning here; nor have ``join_networks`` and
#: ``secret_file``, which say who may use a store an agent serves: etcd's own authentication
#: guards the rendezvous keys, and each round's workers' store admits only the round's
#: participants by address (docs/etcd.md, "Who may use the stores").
CORE_KEYS: frozenset[str] = frozenset(CORE_CONFIG_KEYS) - CORE_KEYS_LEFT_OUT

#: Everything ``--rdzv-conf`` may say to this backend (``RendezvousBackend.config_keys``, which
#: :mod:`launcher_etcd.plugin` declares by name without importing this module).
ALL_CONFIG_KEYS: frozenset[str] = frozenset(ETCD_KEYS) | CORE_KEYS


@dataclass(frozen=True)
class Endpoint:
    """One etcd member's client address."""

    host: str
    port: int

    def url(self, protocol: str) -> str:
        """``protocol://host:port``, IPv6 in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{protocol}://{host}:{self.port}"

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoints(text: str) -> tuple[tuple[Endpoint, ...], str | None]:
    """``host[:port][,host[:port]...]`` (each may start with ``http://`` or ``https://``).

    Returns the endpoints and the scheme they named (``None`` when none did).
    """
    if not text or not text.strip():
        raise RendezvousConfigError(
            "the etcd rendezvous needs --rdzv-endpoint host[:port] naming etcd's client address "
            f"(port {DEFAULT_PORT} by default); give several, comma-separated, to fail over between members"
        )
    endpoints: list[Endpoint] = []
    schemes: set[str] = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "://" in item:
            scheme, _, item = item.partition("://")
            scheme = scheme.lower()
            if scheme not in ("http", "https"):
                raise RendezvousConfigError(
                    f"--rdzv-endpoint scheme {quote_value(scheme)} is not supported: use http or https"
                )
            schemes.add(scheme)
            item = item.rstrip("/")
        try:
            host, port = parse_endpoint(item, DEFAULT_PORT)
        except UsageError as exc:
            raise RendezvousConfigError(str(exc)) from None
        if port == 0:
            raise RendezvousConfigError(f"--rdzv-endpoint {quote_value(item)}: etcd's port cannot be 0")
        endpoints.append(Endpoint(host, port))
    if not endpoints:
        raise RendezvousConfigError("--rdzv-endpoint names no etcd member: give host[:port][,host[:port]...]")
    if len(schemes) > 1:
        raise RendezvousConfigError("--rdzv-endpoint mixes http:// and https://: every member speaks the same")
    return tuple(dict.fromkeys(endpoints)), (schemes.pop() if schemes else None)


def default_lease_ttl(config: DynamicRendezvousConfig) -> int:
    """The lease TTL that lets the core's heartbeat ring report a dead node before its keys go.

    A dead node's heartbeat counter must stay readable until its ring neighbour has seen it stand
    still for the liveness timeout (plus one watcher tick); a counter that vanished earlier would
    read as 0, a change, and restart the neighbour's clock. Keep-alives go out every TTL/3, so the
    lease can expire as early as 2/3 TTL after the last one: 2/3 TTL > liveness + 1 s.
    """
    return max(3, math.ceil(1.5 * (config.liveness_timeout + 1.0)))


def effective_parameters(params: RendezvousParameters) -> RendezvousParameters:
    """``params`` with the etcd backend's reading of ``timeout`` applied.

    torchrun's legacy ``etcd`` backend took ``timeout`` as the join timeout; under that name it
    still is (when ``join_timeout`` is not given). ``etcd-v2``, like c10d, ignores it.
    """
    conf = params.config
    if params.backend != "etcd" or not conf.get("timeout") or conf.get("join_timeout"):
        return params
    return RendezvousParameters(
        backend=params.backend,
        endpoint=params.endpoint,
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        local_addr=params.local_addr,
        config=dict(conf, join_timeout=conf["timeout"]),
    )


def rendezvous_config(params: RendezvousParameters) -> DynamicRendezvousConfig:
    """The core's settings from ``params`` (unknown keys refused, ``timeout`` read as above)."""
    return DynamicRendezvousConfig.from_parameters(
        effective_parameters(params), known=ALL_CONFIG_KEYS, backend=params.backend
    )


def _first(config: Mapping[str, str], *names: str) -> str | None:
    """The value of the first of ``names`` that is set; two spellings with different values is an error."""
    given = {name: config[name] for name in names if config.get(name)}
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{k}={quote_value(v)}" for k, v in given.items())
        raise RendezvousConfigError(f"--rdzv-conf gives {listed}: these are one setting, give it once")
    return next(iter(given.values()), None)


def _existing_file(value: str | None, key: str) -> str | None:
    if value is None:
        return None
    path = os.path.expanduser(value)
    if not os.path.isfile(path):
        raise RendezvousConfigError(f"--rdzv-conf {key}={quote_value(value)}: no such file")
    return path


@dataclass(frozen=True)
class EtcdSettings:
    """Everything the etcd client needs, validated (durations in seconds)."""

    endpoints: tuple[Endpoint, ...]
    protocol: str = "http"
    ca_cert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    username: str | None = None
    password: str | None = None
    #: Prefix of every key of this job, ending in ``/``.
    prefix: str = "/launcher/"
    #: Bound on one store operation, retries and fail-over included (``read_timeout``).
    read_timeout: float = 60.0
    #: Bound on opening one connection; a member that does not answer in this time is skipped.
    connect_timeout: float = 5.0
    lease_ttl: int = 25

    @property
    def urls(self) -> list[str]:
        """Each member's base URL."""
        return [endpoint.url(self.protocol) for endpoint in self.endpoints]

    @classmethod
    def from_parameters(
        cls,
        params: RendezvousParameters,
        config: DynamicRendezvousConfig | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> EtcdSettings:
        """Parse ``--rdzv-endpoint`` and ``--rdzv-conf``.

        Raises :class:`RendezvousConfigError` for invalid values, a missing endpoint included.
        """
        env = os.environ if environ is None else environ
        conf = params.config
        config = config or rendezvous_config(params)
        endpoints, scheme = parse_endpoints(params.endpoint)
        ca_cert = _existing_file(_first(conf, "cacert", "ca_cert"), "cacert")
        client_cert = _existing_file(_first(conf, "cert", "ssl_cert"), "cert")
        client_key = _existing_file(_first(conf, "key", "ssl_cert_key"), "key")
        if (client_cert is None) != (client_key is None):
            raise RendezvousConfigError("--rdzv-conf cert and key go together: give both the certificate and its key")
        protocol = (conf.get("protocol") or "").strip().lower() or None
        if protocol is not None and protocol not in ("http", "https"):
            raise RendezvousConfigError(f"--rdzv-conf protocol={quote_value(protocol)}: use http or https")
        if protocol and scheme and protocol != scheme:
            raise RendezvousConfigError(
                f"--rdzv-conf protocol={protocol} contradicts the {scheme}:// of --rdzv-endpoint"
            )
        tls_files = ca_cert or client_cert
        protocol = protocol or scheme or ("https" if tls_files else "http")
        if protocol == "http" and tls_files:
            raise RendezvousConfigError(
                "--rdzv-conf gives TLS files but protocol=http: drop protocol, or set protocol=https"
            )
        username = conf.get("username") or env.get(USERNAME_ENV) or None
        password = conf.get("password") or env.get(PASSWORD_ENV) or None
        if password is not None and username is None:
            raise RendezvousConfigError("--rdzv-conf password without username: give username too")
        if username is not None and password is None:
            raise RendezvousConfigError(
                f"--rdzv-conf username={quote_value(username)} without a password: give password=... "
                f"or set ${PASSWORD_ENV}"
            )
        return cls(
            endpoints=endpoints,
            protocol=protocol,
            ca_cert=ca_cert,
            client_cert=client_cert,
            client_key=client_key,
            username=username,
            password=password,
            prefix=_prefix(conf.get("etcd_prefix"), params.run_id),
            read_timeout=config.read_timeout,
            connect_timeout=min(5.0, config.read_timeout),
            lease_ttl=_lease_ttl(conf.get("lease_ttl"), config),
        )


def _prefix(value: str | None, run_id: str) -> str:
    if value is None or not value.strip():
        # Quoted: a run id with "/" must not reach into another job's keys.
        return f"/launcher/{quote(run_id, safe='')}/"
    value = value.strip()
    return value if value.endswith("/") else value + "/"


def _lease_ttl(value: str | None, config: DynamicRendezvousConfig) -> int:
    if value is None or not value.strip():
        return default_lease_ttl(config)
    # etcd rounds shorter leases up to its own minimum anyway (about 2 s with default timings).
    try:
        ttl = parse_seconds(value, "--rdzv-conf lease_ttl", low=2)
    except UsageError as exc:
        raise RendezvousConfigError(str(exc)) from None
    return math.ceil(ttl)


def check_parameters(params: RendezvousParameters) -> None:
    """Validate the endpoint and every ``--rdzv-conf`` value before anything starts.

    No I/O but stat and, last, a DNS lookup of the members' host names: when none can exist
    (the resolver says so), that is a usage error too (see :func:`~launcher.rendezvous.endpoint.check_resolvable`).
    """
    settings = EtcdSettings.from_parameters(params)
    check_resolvable([endpoint.host for endpoint in settings.endpoints],
                     f"--rdzv-endpoint {quote_value(params.endpoint)}")  # fmt: skip
