"""The ``etcd`` rendezvous backend: the core's elastic algorithm over :class:`EtcdStore`.

The core's :class:`~launcher.rendezvous.dynamic.DynamicRendezvousHandler` brings the elastic
semantics (rounds, MIN:MAX with last call, scale-up, the heartbeat ring that reports lost
nodes); this backend brings the store, its connection checks and its liveness: each node's
participant record and heartbeat counter are attached to the node's etcd lease.

Imports ``requests`` and ``etcd3gw`` (through :mod:`launcher_etcd.client`) only when called.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from launcher.rendezvous.api import RendezvousError, RendezvousParameters
from launcher.rendezvous.dynamic import KEY_ROOT

from launcher_etcd.settings import EtcdSettings, effective_parameters, rendezvous_config

if TYPE_CHECKING:  # pragma: no cover
    from launcher.rendezvous.dynamic import DynamicRendezvousHandler

    from launcher_etcd.client import EtcdClient

__all__ = ["connect", "create_handler", "owned_by_node"]

log = logging.getLogger("launcher.rendezvous.etcd")

# The core's per-node keys: a participant's record (``<round>/node/<index>``) and its heartbeat
# counter (``<round>/hb/<rank>``), written only by that node. The store API cannot say "this key
# is mine" yet, so the key layout is matched here; see docs/etcd.md ("Liveness").
_OWNED = re.compile(rf"^{re.escape(KEY_ROOT)}/[^/]+/\d+/(?:node|hb)/\d+$")


def owned_by_node(key: str) -> bool:
    """Whether ``key`` (as the core names it) belongs to the node that writes it."""
    return _OWNED.match(key) is not None


def connect(settings: EtcdSettings, run_id: str = "") -> EtcdClient:
    """A client that has reached the cluster, authenticated and read the job's prefix.

    Raises :class:`RendezvousError` with one line saying what is wrong (unreachable within
    ``read_timeout``, TLS, credentials, permissions, not an etcd) instead of a traceback.
    """
    from launcher_etcd.client import EtcdClient, EtcdError, EtcdUnavailableError, b64

    client = EtcdClient(settings)
    prefix = settings.prefix.encode()
    try:
        # A count over the job's prefix: proves reachability, credentials and read permission.
        client.request(
            "/kv/range",
            {"key": b64(prefix), "range_end": b64(prefix[:-1] + bytes([prefix[-1] + 1])), "count_only": True},
        )
    except EtcdUnavailableError as exc:
        client.close()
        raise RendezvousError(
            f"etcd rendezvous {run_id!r}: cannot reach etcd: {exc}. Is etcd running there, and does "
            f"protocol={settings.protocol} match its client URLs?"
        ) from None
    except EtcdError as exc:
        client.close()
        raise RendezvousError(f"etcd rendezvous {run_id!r}: {exc}") from None
    return client


def create_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """The rendezvous handler for ``--rdzv-backend etcd`` (or ``etcd-v2``).

    Raises :class:`~launcher.rendezvous.api.RendezvousConfigError` for invalid ``--rdzv-conf``
    and :class:`RendezvousError` when the cluster cannot be used.
    """
    from launcher.rendezvous.dynamic import handler_over_store

    from launcher_etcd.store import EtcdStore

    config = rendezvous_config(params)
    settings = EtcdSettings.from_parameters(params, config)
    client = connect(settings, params.run_id)
    log.info(
        "rendezvous %r: etcd at %s (%s), keys under %s, lease TTL %d s",
        params.run_id,
        client.endpoints,
        settings.protocol,
        settings.prefix,
        settings.lease_ttl,
    )
    store = EtcdStore(
        client, settings.prefix, lease_ttl=settings.lease_ttl, timeout=config.read_timeout, owned=owned_by_node
    )
    # No master address: etcd cannot serve the workers' store, so group rank 0 names its own
    # address and a free port and its rank-0 worker serves it (torchrun's etcd backends do the same).
    return handler_over_store(store, effective_parameters(params))
