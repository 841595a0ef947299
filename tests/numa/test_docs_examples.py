"""The plugin examples in docs/devices-and-numa.md work as printed."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
from launcher.devices import resolve_nproc_per_node
from launcher.numa import plan_affinity
from launcher.plugins.manager import LauncherPluginManager

from .conftest import HostTree

DOC = Path(__file__).resolve().parents[2] / "docs" / "devices-and-numa.md"


def _example(module_name: str) -> types.ModuleType:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    source = next(block for block in blocks if block.startswith(f'"""{module_name}:'))
    module = types.ModuleType(module_name)
    exec(compile(source, f"{DOC.name}:{module_name}", "exec"), module.__dict__)
    return module


def test_provider_example(
    tmp_path: Path, manager: LauncherPluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _example("launcher_accel")
    # Two accel devices, linked to their PCI functions as the kernel does.
    for index, bus_id in enumerate(["0000:17:00.0", "0000:9a:00.0"]):
        function = tmp_path / "devices" / f"pci{bus_id[:7]}" / bus_id
        function.mkdir(parents=True)
        entry = tmp_path / "class" / "accel" / f"accel{index}"
        entry.mkdir(parents=True)
        (entry / "device").symlink_to(function)
    monkeypatch.setattr(module, "SYSFS_CLASS", str(tmp_path / "class" / "accel"))
    manager.register_plugin(module)

    count, provider = resolve_nproc_per_node("accel", manager)
    assert count == 2 and provider is not None
    assert provider.pci_bus_ids is not None
    assert provider.pci_bus_ids() == ["0000:17:00.0", "0000:9a:00.0"]


@pytest.mark.parametrize("fixture_host", ["two_socket"], indirect=True)
def test_strategy_example(fixture_host: HostTree, manager: LauncherPluginManager) -> None:
    from launcher.plugins.types import DeviceProvider

    manager.register_plugin(_example("launcher_reserve"))
    host = fixture_host.host
    provider = DeviceProvider(name="gpus", count_devices=lambda: 8, pci_bus_ids=lambda: host.bus_ids)
    plan = plan_affinity(
        "node-reserve", 8, provider, manager, sysfs_root=fixture_host.root, on_failure="error"
    )
    node0 = frozenset(range(0, 8)) | frozenset(range(16, 24))
    node1 = frozenset(range(8, 16)) | frozenset(range(24, 32))
    assert plan == [node0 - {0, 16}] * 4 + [node1 - {8, 24}] * 4
