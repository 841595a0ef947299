"""The plugin module the ``launcher`` entry point names: registers ``etcd`` and ``etcd-v2``.

Cheap to import (listing plugins, ``--help`` and every launch import it): it declares the backend
by names only. Neither ``etcd3gw`` nor ``requests`` is loaded until the backend is chosen, nor
:mod:`launcher_etcd.settings` (the keys' table, parsing and checks) until the backend's
``--rdzv-conf`` is checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import RendezvousBackend

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.rendezvous.api import RendezvousHandler, RendezvousParameters
    from launcher.store.api import KeyValueStore


#: The ``--rdzv-conf`` keys only this backend knows: their names. Their defaults, meaning and
#: torchrun spellings are :data:`launcher_etcd.settings.ETCD_KEYS` (a test keeps the two in step).
ETCD_KEY_NAMES = frozenset({"protocol", "cacert", "ca_cert", "cert", "ssl_cert", "key", "ssl_cert_key", "username",
                            "password", "etcd_prefix", "lease_ttl"})
#: The core's rendezvous keys that mean nothing over etcd (why: :data:`launcher_etcd.settings.CORE_KEYS`).
CORE_KEYS_LEFT_OUT = frozenset({"store_type", "is_host", "join_networks", "secret_file"})


def config_keys() -> frozenset[str]:
    """Everything ``--rdzv-conf`` may say to this backend: its own keys and the core's that apply."""
    from launcher.rendezvous.config import CONFIG_KEYS

    return ETCD_KEY_NAMES | (frozenset(CONFIG_KEYS) - CORE_KEYS_LEFT_OUT)


def _check(params: RendezvousParameters) -> None:
    from launcher_etcd.settings import check_parameters

    check_parameters(params)


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
        config_keys=config_keys(),
        check_parameters=_check,
        read_store=_read,
    )
