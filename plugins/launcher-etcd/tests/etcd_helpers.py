"""Helpers shared by the tests: simulated nodes' parameters and stores on a real etcd."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from launcher.rendezvous.api import RendezvousParameters

#: Rendezvous timings that keep tests short: a lost node is noticed within about 2 s.
FAST = {
    "join_timeout": "60",
    "last_call_timeout": "1",
    "keep_alive_interval": "0.5",
    "heartbeat_timeout": "2",
    "read_timeout": "15",
}


def node_params(
    endpoint: str, run_id: str, nnodes: str = "2", backend: str = "etcd", **conf: Any
) -> RendezvousParameters:
    """Parameters of one simulated node, with the FAST timings unless overridden."""
    low, _, high = nnodes.partition(":")
    config = {**FAST, **{key: str(value) for key, value in conf.items()}}
    return RendezvousParameters(
        backend=backend,
        endpoint=endpoint,
        run_id=run_id,
        min_nodes=int(low),
        max_nodes=int(high or low),
        local_addr="127.0.0.1",
        config=config,
    )


def make_store(endpoint: str, prefix: str, *, lease_ttl: int = 2, owned: Callable[[str], bool] | None = None,
               read_timeout: float = 10.0, **conf: str) -> Any:  # fmt: skip
    """An EtcdStore on ``endpoint`` under ``prefix`` (extra ``conf`` as ``--rdzv-conf`` keys)."""
    from launcher_etcd.backend import connect
    from launcher_etcd.settings import EtcdSettings
    from launcher_etcd.store import EtcdStore

    params = node_params(
        endpoint, "store-test", etcd_prefix=prefix, read_timeout=read_timeout, lease_ttl=lease_ttl, **conf
    )
    settings = EtcdSettings.from_parameters(params)
    return EtcdStore(connect(settings), settings.prefix, lease_ttl=lease_ttl, timeout=read_timeout, owned=owned)
