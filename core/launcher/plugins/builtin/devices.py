"""Built-in device providers: ``auto``, ``cpu``, ``cuda`` (alias ``gpu``), ``xpu``, ``privateuse1``.

Registering them imports neither torch nor pynvml; see :mod:`launcher.devices.providers`.
"""

from __future__ import annotations

from collections.abc import Iterator

from launcher.plugins import hookimpl
from launcher.plugins.types import DeviceProvider


@hookimpl
def launcher_device_providers() -> Iterator[DeviceProvider]:
    from launcher.devices.providers import builtin_providers

    yield from builtin_providers()
