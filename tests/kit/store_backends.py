"""Two store-only rendezvous backends, as a plugin module, for the conformance runs in this folder.

``kit-pystore`` reaches a TCPStore-protocol server through launcher's pure-Python client;
``kit-torchstore`` through torch's TCPStore client and the c10d backend's adapter. Neither has
rendezvous code of its own: the core's algorithm runs over their stores.
"""

from __future__ import annotations

from collections.abc import Iterator

from launcher.plugins import hookimpl
from launcher.plugins.types import RendezvousBackend
from launcher.rendezvous.api import RendezvousParameters
from launcher.store.api import KeyValueStore


def _address(params: RendezvousParameters) -> tuple[str, int]:
    from launcher.rendezvous.endpoint import parse_endpoint

    return parse_endpoint(params.endpoint, 29400)


def create_pystore(params: RendezvousParameters) -> KeyValueStore:
    from launcher.store.client import TCPStoreClient

    host, port = _address(params)
    return TCPStoreClient(host, port, timeout=params.get_as_float("read_timeout", 60.0))


def create_torchstore(params: RendezvousParameters) -> KeyValueStore:
    from datetime import timedelta

    import torch.distributed as dist
    from launcher.rendezvous.torch_store import TorchStore

    host, port = _address(params)
    timeout = timedelta(seconds=params.get_as_float("read_timeout", 60.0))
    return TorchStore(dist.TCPStore(host, port, is_master=False, timeout=timeout))


@hookimpl
def launcher_rendezvous_backends() -> Iterator[RendezvousBackend]:
    yield RendezvousBackend(
        name="kit-pystore", description="launcher's TCPStore client to a store service", create_store=create_pystore
    )
    yield RendezvousBackend(
        name="kit-torchstore", description="torch's TCPStore client to a store service", create_store=create_torchstore
    )
