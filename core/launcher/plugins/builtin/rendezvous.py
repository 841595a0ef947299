"""Built-in rendezvous backends: ``static`` and ``c10d``.

A one-node c10d rendezvous on an ephemeral port (``--standalone``) is served by the agent itself
without torch; every other c10d rendezvous runs the core's algorithm over torch's TCPStore.
"""

from __future__ import annotations

from collections.abc import Iterator

from launcher.plugins import hookimpl
from launcher.plugins.types import RendezvousBackend
from launcher.rendezvous.api import RendezvousHandler, RendezvousParameters

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
    }
)


def _create_static(params: RendezvousParameters) -> RendezvousHandler:
    from launcher.rendezvous.static import StaticRendezvous

    return StaticRendezvous(params)


def _create_c10d(params: RendezvousParameters) -> RendezvousHandler:
    from launcher.rendezvous.endpoint import is_loopback, parse_endpoint

    host, port = parse_endpoint(params.endpoint or "localhost:0", 29400)
    if params.max_nodes == 1 and port == 0 and is_loopback(host):
        from launcher.rendezvous.local import LocalRendezvous

        return LocalRendezvous(params.run_id)
    from launcher.rendezvous.c10d import create_handler

    return create_handler(params)


@hookimpl
def launcher_rendezvous_backends() -> Iterator[RendezvousBackend]:
    yield RendezvousBackend(
        name="static",
        description="Fixed set of nodes, each given --node-rank; rank 0 serves the store",
        create_handler=_create_static,
        config_keys=frozenset({"rank", "timeout"}),
    )
    yield RendezvousBackend(
        name="c10d",
        description="Elastic rendezvous over a TCPStore served by the host node",
        create_handler=_create_c10d,
        config_keys=C10D_CONFIG_KEYS,
    )
