"""Test support for launcher plugins: fixtures and conformance suites, shipped with the core.

A plugin distribution tests itself against the same contract the core relies on by subclassing
a conformance suite in its own test files. pytest loads the fixtures automatically (entry point
``pytest11``, :mod:`launcher.testing.pytest_plugin`)::

    from launcher.testing import StoreBackendConformance

    class TestAcmeStore(StoreBackendConformance):
        backend_name = "acme-store"

        @pytest.fixture
        def rendezvous_endpoint(self, launcher_store_server):
            return launcher_store_server.address

One suite per kind of plugin (:func:`conformance_suites`):

:class:`KeyValueStoreConformance`
    every :class:`~launcher.store.api.KeyValueStore` operation: blocking reads and their
    timeouts, ``compare_set``, ``add`` atomicity under threads, ``multi_get``, ``delete``, ``check``.
:class:`RendezvousBackendConformance`
    simulated nodes (threads, or a killed process) against a backend: ranks, MIN:MAX closing,
    late nodes, lost nodes, closing, run-id isolation. :class:`StoreBackendConformance` runs
    both for a store-only backend, whose rendezvous is the core's algorithm over its store.
:class:`LogsSpecsConformance`, :class:`EventHandlerConformance`, :class:`NumaStrategyConformance`,
:class:`DeviceProviderConformance`, :class:`ClusterEnvironmentConformance`
    the contracts of the other five kinds (cluster environments: sample jobs' environments).
:class:`HealthCheckConformance`
    health checks: one-line answers within the time limit, nothing left running, sick when it should be.
:class:`TopologySourceConformance`
    topology sources: paths for the nodes they place, one-line refusals, an order that keeps each
    domain together.

Every suite also checks that the plugin module imports quickly and without torch
(:class:`PluginModuleConformance`). See ``docs/plugins.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

# The suites' asserts should read as well as a test file's: have pytest rewrite them (their
# modules are imported only after this line).
pytest.register_assert_rewrite(
    "launcher.testing.plugin_suite",
    "launcher.testing.store_suite",
    "launcher.testing.rendezvous_suite",
    "launcher.testing.simulated_nodes",
    "launcher.testing.logs_suite",
    "launcher.testing.events_suite",
    "launcher.testing.numa_suite",
    "launcher.testing.devices_suite",
    "launcher.testing.clusters_suite",
    "launcher.testing.health_suite",
    "launcher.testing.topology_suite",
)

if TYPE_CHECKING:  # pragma: no cover - the names below are imported on first use
    from launcher.testing.clusters_suite import ClusterEnvironmentConformance, plain_environments
    from launcher.testing.devices_suite import DeviceProviderConformance
    from launcher.testing.events_suite import EventHandlerConformance, sample_events
    from launcher.testing.health_suite import HealthCheckConformance, standard_contexts
    from launcher.testing.logs_suite import LogsSpecsConformance, worker_envs
    from launcher.testing.numa_suite import NumaStrategyConformance
    from launcher.testing.plugin_suite import PluginModuleConformance
    from launcher.testing.rendezvous_suite import (
        NodeProcess,
        PendingRendezvous,
        RendezvousBackendConformance,
        SeverableStore,
        SimulatedNode,
        SimulatedNodes,
        StoreBackendConformance,
        create_handler,
    )
    from launcher.testing.store_suite import KeyValueStoreConformance
    from launcher.testing.sysfs import FakeTopology, standard_topologies
    from launcher.testing.topology_suite import TopologySourceConformance

# Where each public name lives. Imported on first use, so that loading the pytest plugin (in
# every pytest run of an environment that has launcher) imports none of the suites.
_EXPORTS = {
    "ClusterEnvironmentConformance": "clusters_suite",
    "plain_environments": "clusters_suite",
    "DeviceProviderConformance": "devices_suite",
    "EventHandlerConformance": "events_suite",
    "HealthCheckConformance": "health_suite",
    "standard_contexts": "health_suite",
    "sample_events": "events_suite",
    "LogsSpecsConformance": "logs_suite",
    "worker_envs": "logs_suite",
    "NumaStrategyConformance": "numa_suite",
    "PluginModuleConformance": "plugin_suite",
    "NodeProcess": "rendezvous_suite",
    "PendingRendezvous": "rendezvous_suite",
    "RendezvousBackendConformance": "rendezvous_suite",
    "SeverableStore": "rendezvous_suite",
    "SimulatedNode": "rendezvous_suite",
    "SimulatedNodes": "rendezvous_suite",
    "StoreBackendConformance": "rendezvous_suite",
    "create_handler": "rendezvous_suite",
    "KeyValueStoreConformance": "store_suite",
    "TopologySourceConformance": "topology_suite",
    "FakeTopology": "sysfs",
    "standard_topologies": "sysfs",
}

#: The conformance suite of each plugin kind (keyed by ``kind`` of each class of
#: ``launcher.plugins.types.REGISTRATION_CLASSES``), as ``(module, class name)`` under
#: ``launcher.testing``; :func:`conformance_suites` imports them.
#: The rendezvous kind's suite is :class:`RendezvousBackendConformance`; a store-only backend
#: uses :class:`StoreBackendConformance`, which adds :class:`KeyValueStoreConformance`.
SUITES_BY_KIND: dict[str, tuple[str, str]] = {
    "rendezvous backend": ("rendezvous_suite", "RendezvousBackendConformance"),
    "logs specs": ("logs_suite", "LogsSpecsConformance"),
    "event handler": ("events_suite", "EventHandlerConformance"),
    "numa strategy": ("numa_suite", "NumaStrategyConformance"),
    "device provider": ("devices_suite", "DeviceProviderConformance"),
    "cluster environment": ("clusters_suite", "ClusterEnvironmentConformance"),
    "health check": ("health_suite", "HealthCheckConformance"),
    "topology source": ("topology_suite", "TopologySourceConformance"),
}


def conformance_suites() -> dict[str, type]:
    """The conformance suite class of each plugin kind."""
    return {kind: getattr(_load(module), name) for kind, (module, name) in SUITES_BY_KIND.items()}


def _load(module: str) -> Any:
    import importlib

    return importlib.import_module(f"launcher.testing.{module}")


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(_load(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'launcher.testing' has no attribute {name!r}")


__all__ = [
    "SUITES_BY_KIND",
    "conformance_suites",
    "ClusterEnvironmentConformance",
    "DeviceProviderConformance",
    "EventHandlerConformance",
    "HealthCheckConformance",
    "FakeTopology",
    "KeyValueStoreConformance",
    "LogsSpecsConformance",
    "NodeProcess",
    "NumaStrategyConformance",
    "PendingRendezvous",
    "PluginModuleConformance",
    "RendezvousBackendConformance",
    "SeverableStore",
    "SimulatedNode",
    "SimulatedNodes",
    "StoreBackendConformance",
    "TopologySourceConformance",
    "create_handler",
    "sample_events",
    "standard_contexts",
    "standard_topologies",
    "plain_environments",
    "worker_envs",
]
