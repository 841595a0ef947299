"""Built-in rendezvous backends: ``static`` and ``c10d``.

A one-node c10d rendezvous on an ephemeral port (``--standalone``) is served by the agent itself;
every other c10d rendezvous runs the core's algorithm over launcher's own TCPStore, served by the
endpoint's host, or over torch's FileStore with ``store_type=file`` (the endpoint is then a path).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import RendezvousBackend
from launcher.rendezvous.api import RendezvousHandler, RendezvousParameters

if TYPE_CHECKING:  # pragma: no cover
    from launcher.store.api import KeyValueStore

#: torchrun's c10d keys, plus launcher's own (see docs/rendezvous.md). Spelled out rather than
#: imported from launcher.rendezvous.config to keep that module off the start-up path; a test
#: checks that the two agree.
C10D_CONFIG_KEYS = frozenset(
    {
        "store_type",
        "read_timeout",
        "is_host",
        "join_timeout",
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
        "timeout",
        "stable_rank0",
        "join_networks",
        "secret_file",
    }
)


#: The static backend's keys; ``join_networks`` and ``secret_file`` as for c10d.
STATIC_CONFIG_KEYS = frozenset({"rank", "timeout", "join_networks", "secret_file"})


def _file_store(params: RendezvousParameters) -> bool:
    """Whether ``--rdzv-conf store_type=file`` is asked for (the endpoint is then a file path)."""
    return (params.config.get("store_type") or "").strip().lower() == "file"


def _create_static(params: RendezvousParameters) -> RendezvousHandler:
    from launcher.rendezvous.static import StaticRendezvous

    return StaticRendezvous(params)


def _create_c10d(params: RendezvousParameters) -> RendezvousHandler:
    from launcher.rendezvous.endpoint import is_loopback, parse_endpoint

    if _file_store(params):
        from launcher.rendezvous.c10d import create_handler as create_file_handler

        return create_file_handler(params)
    host, port = parse_endpoint(params.endpoint or "localhost:0", 29400)
    if params.max_nodes == 1 and port == 0 and is_loopback(host):
        from launcher.rendezvous.local import LocalRendezvous

        return LocalRendezvous(params.run_id)
    from launcher.rendezvous.c10d import create_handler

    return create_handler(params)


def _check_static(params: RendezvousParameters) -> None:
    from launcher.rendezvous.config import store_admission
    from launcher.rendezvous.endpoint import parse_endpoint
    from launcher.values import MAX_SECONDS, parse_int, parse_seconds

    parse_int(params.config.get("rank", "0"), "--node-rank", 0, params.max_nodes - 1)
    if "timeout" in params.config:
        parse_seconds(params.config["timeout"], "--rdzv-conf timeout", MAX_SECONDS, zero=False)
    parse_endpoint(params.endpoint, 29500)
    store_admission(params.config)


def _check_c10d(params: RendezvousParameters) -> None:
    from launcher.rendezvous.api import RendezvousConfigError
    from launcher.rendezvous.config import DynamicRendezvousConfig
    from launcher.rendezvous.endpoint import check_resolvable, parse_endpoint
    from launcher.values import quote

    DynamicRendezvousConfig.from_parameters(params, known=C10D_CONFIG_KEYS)
    if _file_store(params):
        # The endpoint is the path of a file every node shares, not host:port.
        if not params.endpoint.strip():
            raise RendezvousConfigError(
                "--rdzv-conf store_type=file needs --rdzv-endpoint naming the store's file (shared by every node)"
            )
        return
    if not params.endpoint.strip():
        if params.max_nodes > 1:
            raise RendezvousConfigError(
                f"the c10d rendezvous of a multi-node job (--nnodes {params.min_nodes}:{params.max_nodes}) needs "
                "--rdzv-endpoint host[:port] naming the node that serves the store (port 29400 by default)"
            )
        return
    host, _port = parse_endpoint(params.endpoint, 29400)
    # A name DNS says does not exist is a typo: a usage error now, not a failed connect later.
    check_resolvable([host], f"rendezvous endpoint {quote(params.endpoint)}")


def _read_c10d(params: RendezvousParameters) -> KeyValueStore:
    from launcher.status.remote import c10d_read_store

    return c10d_read_store(params)


@hookimpl
def launcher_rendezvous_backends() -> Iterator[RendezvousBackend]:
    yield RendezvousBackend(
        name="static",
        description="Fixed set of nodes, each given --node-rank; rank 0 serves the store",
        create_handler=_create_static,
        config_keys=STATIC_CONFIG_KEYS,
        check_parameters=_check_static,
    )
    yield RendezvousBackend(
        name="c10d",
        description="Elastic rendezvous over a TCPStore served by the host node",
        create_handler=_create_c10d,
        config_keys=C10D_CONFIG_KEYS,
        check_parameters=_check_c10d,
        read_store=_read_c10d,
    )
