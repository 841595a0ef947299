"""The plugin module the ``launcher`` entry point names: registers ``etcd`` and ``etcd-v2``.

Cheap to import (listing plugins and ``--help`` import it): neither ``etcd3gw`` nor ``requests``
is loaded until the backend is chosen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import RendezvousBackend

from launcher_etcd.settings import ALL_CONFIG_KEYS, check_parameters

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.rendezvous.api import RendezvousHandler, RendezvousParameters
    from launcher.store.api import KeyValueStore


def _create(params: RendezvousParameters) -> RendezvousHandler:
    from launcher_etcd.backend import create_handler

    return create_handler(params)


def _read(params: RendezvousParameters) -> KeyValueStore:
    from launcher_etcd.backend import read_store

    return read_store(params)


@hookimpl
def launcher_rendezvous_backends() -> Iterator[RendezvousBackend]:
    """Register ``etcd``, with torchrun's ``etcd-v2`` as another name for it."""
    yield RendezvousBackend(
        name="etcd",
        aliases=("etcd-v2",),
        description="Elastic rendezvous over etcd's v3 API (leases, watches, fail-over between members)",
        create_handler=_create,
        config_keys=ALL_CONFIG_KEYS,
        check_parameters=check_parameters,
        read_store=_read,
    )
