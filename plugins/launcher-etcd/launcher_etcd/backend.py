"""The ``etcd`` rendezvous backend: the core's elastic algorithm over :class:`EtcdStore`.

The core's :class:`~launcher.rendezvous.dynamic.DynamicRendezvousHandler` brings the elastic
semantics (rounds, MIN:MAX with last call, scale-up, the heartbeat ring that reports lost
nodes); this backend brings the store, its connection checks and its liveness: each node's
participant record and heartbeat counter are attached to the node's etcd lease.

Imports ``requests`` and ``etcd3gw`` (through :mod:`launcher_etcd.client`) only when called.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from launcher.rendezvous.api import RendezvousError, RendezvousParameters
from launcher.rendezvous.keys import RendezvousKeys, is_per_node, parse_key

from launcher_etcd.settings import EtcdSettings, effective_parameters, rendezvous_config

if TYPE_CHECKING:  # pragma: no cover
    from launcher.rendezvous.dynamic import DynamicRendezvousHandler

    from launcher_etcd.client import EtcdClient
    from launcher_etcd.store import EtcdStore

__all__ = ["clear_finished_job", "connect", "create_handler", "owned_by_node", "read_store"]

log = logging.getLogger("launcher.rendezvous.etcd")

def owned_by_node(key: str) -> bool:
    """Whether ``key`` (as the core names it) belongs to the node that writes it.

    These are the core's per-node keys (:func:`launcher.rendezvous.keys.is_per_node`): a
    participant's record and its heartbeat counter, written only by that node; they are
    attached to its lease (see docs/etcd.md, "Liveness").
    """
    return is_per_node(key)


def _after(prefix: bytes) -> bytes:
    """The end of etcd's range of keys starting with ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def clear_finished_job(client: EtcdClient, prefix: str, run_id: str) -> bool:
    """Remove what an ended job with this run id left in etcd, once none of its nodes lives.

    The core's shared keys (rounds, the closed mark) carry no lease, so they outlive the job: a
    new job with the same ``--rdzv-id`` would find the rendezvous closed, or wait to be admitted
    to a round whose nodes all died. With c10d the store dies with the job instead. Here the
    job's keys are deleted when it is over, closed or its last round sealed, and no participant
    of its last two rounds still holds a leased key (each live node keeps its record and
    heartbeat alive). A round that is still forming is never judged: its first nodes may not
    have written their records yet. The deletion is guarded by the revisions of the keys it was
    decided on, so of several new nodes starting at once only the first deletes, and it does so
    before any of them writes. Returns whether keys were deleted.
    """
    from launcher_etcd.client import b64, unb64

    keys = RendezvousKeys(run_id)
    stored = prefix.encode()  # etcd holds the core's key K as prefix + K

    def name(key: str) -> bytes:
        return stored + key.encode()

    base = name(keys.run_prefix)
    current = client.range(name(keys.current)).get("kvs") or []
    if not current:
        return False  # a new job id, or a job that has not opened its first round yet
    raw = unb64(current[0].get("value", "")) or b"0"
    if raw.isdigit():
        last = int(raw)
    else:
        # A closed job swaps the round number for "closed": find its last round from the keys.
        listing = client.range(base, range_end=b64(_after(base)), keys_only=True).get("kvs") or []
        parsed = (parse_key(unb64(kv["key"])[len(stored) :].decode(errors="replace")) for kv in listing)
        last = max((key.round for key in parsed if key is not None and key.round is not None), default=0)
    closed = name(keys.closed)
    ended = client.range(closed).get("kvs") or client.range(name(keys.sealed(last))).get("kvs")
    if not ended:
        return False
    counts = [
        {"request_range": {"key": b64(start), "range_end": b64(_after(start)), "count_only": True}}
        for r in {last, max(last - 1, 0)}
        for start in (name(keys.node_prefix(r)), name(keys.heartbeat_prefix(r)))
    ]
    answer = client.txn(success=counts)
    if any(int((reply.get("response_range") or {}).get("count", 0)) for reply in answer.get("responses") or []):
        if ended[0]["key"] == b64(closed):
            log.warning(
                "rendezvous %r: a job with this id has ended and some of its nodes' keys have not expired "
                "yet; this node will find the rendezvous closed. Use a new --rdzv-id, or start again once "
                "they expire (lease_ttl)",
                run_id,
            )
        return False  # a live job (or one whose nodes died less than lease_ttl ago)
    guard = [
        {"key": ended[0]["key"], "target": "MOD", "result": "EQUAL", "mod_revision": ended[0]["mod_revision"]},
        {"key": current[0]["key"], "target": "MOD", "result": "EQUAL", "mod_revision": current[0]["mod_revision"]},
    ]
    result = client.txn(guard, [{"request_delete_range": {"key": b64(base), "range_end": b64(_after(base))}}])
    if result.get("succeeded"):
        log.info("rendezvous %r: removed the keys an ended job with this id left in etcd", run_id)
        return True
    return False


def connect(settings: EtcdSettings, run_id: str = "") -> EtcdClient:
    """A client that has reached the cluster, authenticated and read the job's prefix.

    Raises :class:`RendezvousError` with one line saying what is wrong (unreachable within
    ``read_timeout``, TLS, credentials, permissions, not an etcd) instead of a traceback.
    """
    from launcher_etcd.client import EtcdClient, EtcdError, EtcdUnavailableError, b64

    unknown = unresolvable_hosts(settings)
    if unknown is not None:
        raise RendezvousError(
            f"etcd rendezvous {run_id!r}: cannot resolve the etcd endpoint host(s) {unknown}; "
            "check --rdzv-endpoint, or give IP addresses if this node has no working DNS"
        )
    client = EtcdClient(settings)
    prefix = settings.prefix.encode()
    try:
        # A count over the job's prefix: proves reachability, credentials and read permission.
        client.request("/kv/range", {"key": b64(prefix), "range_end": b64(_after(prefix)), "count_only": True})
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


def unresolvable_hosts(settings: EtcdSettings, wait: float = 10.0) -> str | None:
    """The hosts, when no endpoint's host name exists in DNS; else ``None``.

    Retrying a name the resolver says does not exist (EAI_NONAME) only turns a typo into a
    ``read_timeout``-long wait, so that fails at once. A temporary failure (EAI_AGAIN), or a
    resolver slower than ``wait`` seconds, leaves the decision to the client's retries.
    """
    import socket
    import threading

    definitive = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}
    answers: dict[str, str | None] = {}

    def resolve() -> None:
        for endpoint in settings.endpoints:
            try:
                socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                answers[endpoint.host] = exc.strerror if exc.errno in definitive else None
                if exc.errno not in definitive:
                    return
            except OSError:
                return
            else:
                return  # one resolvable member is enough to try

    worker = threading.Thread(target=resolve, name="etcd-resolve", daemon=True)
    worker.start()
    worker.join(min(wait, settings.read_timeout))
    if worker.is_alive() or len(answers) != len(settings.endpoints) or None in answers.values():
        return None
    reason = next(iter(answers.values()))
    return f"{', '.join(repr(host) for host in answers)}: {reason}"


def read_store(params: RendezvousParameters) -> EtcdStore:
    """A store that only reads the job's keys, for ``launcher status --rdzv-backend etcd``: it
    reaches etcd as an agent would (the same endpoints, TLS and credentials), but takes no lease
    (the store grants one only when a node's own key is written), joins nothing and clears nothing."""
    from launcher_etcd.store import EtcdStore

    config = rendezvous_config(params)
    settings = EtcdSettings.from_parameters(params, config)
    client = connect(settings, params.run_id)
    return EtcdStore(client, settings.prefix, lease_ttl=settings.lease_ttl, timeout=config.read_timeout)


def create_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """The rendezvous handler for ``--rdzv-backend etcd`` (or ``etcd-v2``).

    Raises :class:`~launcher.rendezvous.api.RendezvousConfigError` for invalid ``--rdzv-conf``
    and :class:`RendezvousError` when the cluster cannot be used.
    """
    from launcher.rendezvous.dynamic import handler_over_store

    from launcher_etcd.client import EtcdError
    from launcher_etcd.store import EtcdStore

    config = rendezvous_config(params)
    settings = EtcdSettings.from_parameters(params, config)
    client = connect(settings, params.run_id)
    try:
        clear_finished_job(client, settings.prefix, params.run_id)
    except EtcdError as exc:
        client.close()
        raise RendezvousError(f"etcd rendezvous {params.run_id!r}: {exc}") from None
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
    store.parameters = params  # for the death notice a dead agent's watchdog runs
    # No master address: etcd cannot serve the workers' store, so group rank 0 names its own
    # address and a free port and its rank-0 worker serves it (torchrun's etcd backends do the same).
    return handler_over_store(store, effective_parameters(params))
