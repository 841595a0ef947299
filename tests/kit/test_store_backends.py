"""launcher.testing's store and rendezvous suites against the core's own stores.

(a) launcher's pure-Python ``StoreServer`` and ``TCPStoreClient`` (and the server's in-process
view); (b) the c10d backend's adapter (``TorchStore``) over torch's TCPStore client, against
torch's own server and against launcher's. (a) and (b) each also run as a store-only rendezvous
backend, so the core's rendezvous algorithm is checked over each.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from launcher.store.api import KeyValueStore
from launcher.store.server import StoreServer
from launcher.testing import KeyValueStoreConformance, StoreBackendConformance

from tests.kit import store_backends

HAS_TORCH_STORE = (
    importlib.util.find_spec("torch") is not None
    and importlib.util.find_spec("launcher.rendezvous.torch_store") is not None
)
needs_torch_store = pytest.mark.skipif(
    not HAS_TORCH_STORE, reason="needs torch and launcher.rendezvous.torch_store (the c10d backend's adapter)"
)


class TestInProcessStore(KeyValueStoreConformance):
    """The server's in-process view, which the agent uses for its exit barrier."""

    @pytest.fixture
    def kv_store_factory(self, launcher_store_server: StoreServer) -> Callable[[], KeyValueStore]:
        return lambda: launcher_store_server.store


class TestPurePythonStoreBackend(StoreBackendConformance):
    """launcher's client (``create_store``) to launcher's server: both suites."""

    backend_name = "kit-pystore"
    plugin = store_backends

    @pytest.fixture
    def rendezvous_endpoint(self, launcher_store_server: StoreServer) -> str:
        return launcher_store_server.address


@pytest.fixture
def torch_store_server() -> Iterator[Any]:
    """torch's own TCPStore server on a free loopback port."""
    import torch.distributed as dist

    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True, timeout=timedelta(seconds=30)
    )
    yield server
    del server


def _torch_client(host: str, port: int) -> KeyValueStore:
    import torch.distributed as dist
    from launcher.rendezvous.torch_store import TorchStore

    return TorchStore(dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30)))


@needs_torch_store
class TestTorchStoreAdapterOnLauncherServer(KeyValueStoreConformance):
    """The adapter over torch's client, talking to launcher's server."""

    @pytest.fixture
    def kv_store_factory(self, launcher_store_server: StoreServer) -> Callable[[], KeyValueStore]:
        return lambda: _torch_client(launcher_store_server.host, launcher_store_server.port)


@needs_torch_store
class TestTorchStoreBackend(StoreBackendConformance):
    """The c10d backend's adapter over torch's client and torch's server: both suites."""

    backend_name = "kit-torchstore"
    plugin = store_backends

    @pytest.fixture
    def rendezvous_endpoint(self, torch_store_server: Any) -> str:
        return f"127.0.0.1:{int(torch_store_server.port)}"
