"""Conformance suite for device-count providers (``launcher_device_providers``).

``count_devices`` must answer a non-negative integer, or raise
:class:`~launcher.devices.DeviceUnavailableError` (with a message for the user) when the kind
cannot exist on this host; ``--nproc-per-node NAME`` must then resolve through the core. The
optional fields must keep their promises: as many PCI bus ids as devices, a real variable
name for ``visible_devices_env``, a boolean from ``answers_to``, a registered provider from
``choose``.
"""

from __future__ import annotations

import re
import time
from typing import ClassVar

import pytest

from launcher.devices import DeviceUnavailableError, resolve_nproc_per_node
from launcher.errors import UsageError
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import DeviceProvider, Registration
from launcher.testing.plugin_suite import PluginModuleConformance, manager_holding

__all__ = ["DeviceProviderConformance"]

_BUS_ID = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _manager_with(registration: DeviceProvider, manager: LauncherPluginManager) -> LauncherPluginManager:
    """``manager`` if it resolves the registration's name to it, else a manager holding only it."""
    try:
        if manager.get(DeviceProvider, registration.name) is registration:
            return manager
    except UsageError:
        pass
    return manager_holding(registration)


class DeviceProviderConformance(PluginModuleConformance):
    """Tests a device-count provider on this host.

    Set ``device_provider_name`` (the ``--nproc-per-node`` name) or override the
    ``device_provider`` fixture. ``count_time_limit`` bounds one ``count_devices`` call
    (seconds, default 2): the agent counts before anything starts.
    """

    registration_type: ClassVar[type[Registration]] = DeviceProvider
    registration_fixture: ClassVar[str] = "device_provider"

    #: The ``--nproc-per-node`` name under test.
    device_provider_name: ClassVar[str | None] = None
    #: Seconds one ``count_devices`` call may take.
    count_time_limit: ClassVar[float] = 2.0

    @pytest.fixture
    def device_provider(self, plugin_manager: LauncherPluginManager) -> DeviceProvider:
        """The registration under test (default: ``device_provider_name`` on the plugin manager)."""
        return self.registration_under_test(plugin_manager, self.device_provider_name, DeviceProvider)

    def _count(self, provider: DeviceProvider) -> int | None:
        """The count, or None when the provider says its kind cannot exist here."""
        started = time.monotonic()
        try:
            count = provider.count_devices()
        except DeviceUnavailableError as exc:
            assert str(exc).strip(), "DeviceUnavailableError must tell the user why"
            return None
        elapsed = time.monotonic() - started
        assert isinstance(count, int) and not isinstance(count, bool), (
            f"count_devices returned {count!r}, not an int"
        )
        assert count >= 0, f"count_devices returned {count}"
        assert elapsed < self.count_time_limit, f"count_devices took {elapsed:.2f} s"
        return count

    def test_count_devices_is_a_non_negative_int(self, device_provider: DeviceProvider) -> None:
        first = self._count(device_provider)
        assert self._count(device_provider) == first, "two counts in a row disagree"

    def test_resolves_nproc_per_node(
        self, device_provider: DeviceProvider, plugin_manager: LauncherPluginManager
    ) -> None:
        manager = _manager_with(device_provider, plugin_manager)
        count = self._count(device_provider) if device_provider.choose is None else None
        try:
            nproc, chosen = resolve_nproc_per_node(device_provider.name, manager)
        except UsageError as exc:
            assert not count, f"--nproc-per-node {device_provider.name} failed with {count} devices: {exc}"
            assert len(str(exc).splitlines()) == 1, "the error must be one line"
            return
        assert chosen is not None
        assert nproc >= 1
        if device_provider.choose is None:
            assert (nproc, chosen) == (count, device_provider)

    def test_pci_bus_ids(self, device_provider: DeviceProvider) -> None:
        if device_provider.pci_bus_ids is None:
            pytest.skip("the provider reports no PCI bus ids")
        count = self._count(device_provider)
        if count is None:
            pytest.skip("this kind of device cannot exist on this host")
        ids = list(device_provider.pci_bus_ids())
        assert len(ids) == count, f"{len(ids)} bus ids for {count} devices: one per device, in device order"
        for bus_id in ids:
            assert bus_id is None or _BUS_ID.match(bus_id), f"{bus_id!r} is not a PCI bus id (0000:17:00.0)"

    def test_visible_devices_env(self, device_provider: DeviceProvider) -> None:
        name = device_provider.visible_devices_env
        assert name is None or _ENV_NAME.match(name), f"visible_devices_env {name!r} is not a variable name"

    def test_answers_to_an_unknown_name(self, device_provider: DeviceProvider) -> None:
        if device_provider.answers_to is None:
            pytest.skip("the provider claims no names beyond its own")
        answer = device_provider.answers_to("no-such-device-kind")
        assert answer is False, f"answers_to('no-such-device-kind') returned {answer!r}"

    def test_choose_picks_a_registered_provider(
        self, device_provider: DeviceProvider, plugin_manager: LauncherPluginManager
    ) -> None:
        if device_provider.choose is None:
            pytest.skip("the provider stands for no other")
        from launcher.devices import registered_providers

        providers = registered_providers(plugin_manager)
        chosen = device_provider.choose(providers)
        assert chosen in providers, f"choose() returned {chosen!r}, which is not registered"
