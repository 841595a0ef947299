"""From the rendezvous settings to a rendezvous handler, through the backend plugins.

The plan reads :class:`~launcher.rendezvous.settings.RendezvousSettings` (the ``rendezvous`` flag
group's object, or the one :meth:`~launcher.config.LaunchConfig.to_settings` gives);
:func:`rendezvous_parameters`, :func:`check_rendezvous_config` and :func:`create_rendezvous_handler`
take a :class:`~launcher.config.LaunchConfig`, for the Python API and the plugins' tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.rendezvous.api import RendezvousConfigError, RendezvousHandler, RendezvousParameters

if TYPE_CHECKING:  # pragma: no cover
    from launcher.config import LaunchConfig
    from launcher.plugins.manager import LauncherPluginManager
    from launcher.plugins.types import RendezvousBackend
    from launcher.rendezvous.settings import RendezvousSettings
    from launcher.store.api import KeyValueStore

def parameters_for(rdzv: RendezvousSettings) -> RendezvousParameters:
    """What the backend receives: the settings' values, ``--rdzv-conf`` as text."""
    return RendezvousParameters(
        backend=rdzv.backend,
        endpoint=rdzv.endpoint,
        run_id=rdzv.run_id,
        min_nodes=rdzv.min_nodes,
        max_nodes=rdzv.max_nodes,
        local_addr=rdzv.local_addr,
        config={str(k): str(v) for k, v in rdzv.configs.items()},
    )


def rendezvous_parameters(config: LaunchConfig) -> RendezvousParameters:
    """:func:`parameters_for` a :class:`~launcher.config.LaunchConfig`'s rendezvous fields."""
    return parameters_for(config.to_settings()["rendezvous"])


def _backend(backend: str, manager: LauncherPluginManager) -> RendezvousBackend:
    from launcher.plugins.types import RendezvousBackend

    return manager.get(RendezvousBackend, backend)


def check_rendezvous_settings(rdzv: RendezvousSettings, manager: LauncherPluginManager) -> RendezvousBackend:
    """The backend exists, understands every ``--rdzv-conf`` key, and accepts every value; the backend.

    Runs before anything starts, for every backend: its own ``check_parameters`` when it has
    one; for a store-only backend, the core's reading of the values; for a backend that accepts
    any key (torch's handlers), at least the values of the keys the core also knows.
    """
    from launcher.rendezvous.config import CONFIG_KEYS, DynamicRendezvousConfig, check_core_values
    from launcher.values import quote

    reg = _backend(rdzv.backend, manager)
    params = parameters_for(rdzv)
    if reg.config_keys is not None:
        known = set(reg.config_keys)
        if reg.create_store is not None:
            # A store-only backend runs the core's algorithm, which reads the core's keys too.
            known |= set(CONFIG_KEYS)
        unknown = sorted(set(rdzv.configs) - known)
        if unknown:
            raise RendezvousConfigError(
                f"--rdzv-conf key {quote(unknown[0])} is unknown to the {reg.name} backend; "
                f"known keys: {', '.join(sorted(known))}"
            )
    if reg.check_parameters is not None:
        reg.check_parameters(params)
    elif reg.create_store is not None:
        DynamicRendezvousConfig.from_parameters(params)
    else:
        check_core_values(params.config)
    return reg


def check_rendezvous_config(config: LaunchConfig, manager: LauncherPluginManager) -> None:
    """:func:`check_rendezvous_settings` for a :class:`~launcher.config.LaunchConfig`."""
    check_rendezvous_settings(config.to_settings()["rendezvous"], manager)


def handler_for(
    backend: RendezvousBackend,
    params: RendezvousParameters,
    *,
    wrap_store: Callable[[KeyValueStore], KeyValueStore] | None = None,
) -> RendezvousHandler:
    """The handler ``backend`` gives: its own, or the core's algorithm over its store.

    ``wrap_store`` may stand between a store-only backend's store and the algorithm (tests use
    it to cut a simulated node off its store).
    """
    if backend.create_handler is not None:
        return backend.create_handler(params)
    assert backend.create_store is not None
    store = backend.create_store(params)
    if wrap_store is not None:
        store = wrap_store(store)
    from launcher.rendezvous.dynamic import handler_over_store

    return handler_over_store(store, params)


def create_rendezvous_handler(config: LaunchConfig, manager: LauncherPluginManager) -> RendezvousHandler:
    """The handler of the configured backend; a store-only backend gets the core's algorithm."""
    return handler_for(_backend(config.rdzv_backend, manager), rendezvous_parameters(config))
