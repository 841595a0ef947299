"""The built-in ``c10d`` backend (a handler backend) against the rendezvous conformance suite.

The store is served by a fixture rather than by one of the simulated nodes (``is_host=false``
on every node), so that killing a node never takes the store down with it; a lost node runs in
a forked process and is SIGKILLed.
"""

from __future__ import annotations

import importlib.util

import pytest
from launcher.store.server import StoreServer
from launcher.testing import RendezvousBackendConformance

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("launcher.rendezvous.c10d") is None,
    reason="needs torch and launcher.rendezvous.c10d",
)


class TestC10dBackend(RendezvousBackendConformance):
    backend_name = "c10d"

    @pytest.fixture
    def rendezvous_endpoint(self, launcher_store_server: StoreServer) -> str:
        return launcher_store_server.address

    @pytest.fixture
    def rendezvous_config(self) -> dict[str, str]:
        return {"is_host": "false"}
