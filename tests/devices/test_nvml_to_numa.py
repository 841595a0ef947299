"""From NVML's PCI bus ids to CPU sets: the cuda provider drives NUMA binding."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from launcher.devices import resolve_nproc_per_node
from launcher.numa import plan_affinity
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import DeviceProvider

from .conftest import FakeNvml

BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
NODE_CPUS = {0: "0-3", 1: "4-7"}


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Two NUMA nodes of four CPUs; GPUs 0-3 on node 0, 4-7 on node 1."""
    for node, cpus in NODE_CPUS.items():
        path = tmp_path / "devices" / "system" / "node" / f"node{node}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(cpus + "\n")
    for index, bus in enumerate(BUSES):
        path = tmp_path / "bus" / "pci" / "devices" / f"0000:{bus}:00.0"
        path.mkdir(parents=True)
        (path / "numa_node").write_text(f"{index // 4}\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    return str(tmp_path)


@pytest.fixture
def eight_gpus(fake_nvml: FakeNvml) -> FakeNvml:
    fake_nvml.configure(
        [
            {"uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000", "bus_id": f"00000000:{b.upper()}:00.0"}
            for i, b in enumerate(BUSES)
        ]
    )
    return fake_nvml


NODE0 = frozenset(range(0, 4))
NODE1 = frozenset(range(4, 8))


def test_cuda_devices_bind_to_their_nodes(
    eight_gpus: FakeNvml, sysfs: str, manager: LauncherPluginManager
) -> None:
    nproc, provider = resolve_nproc_per_node("cuda", manager)
    assert nproc == 8
    plan = plan_affinity("node", nproc, provider, manager, sysfs_root=sysfs, on_failure="error")
    assert plan == [NODE0] * 4 + [NODE1] * 4


def test_cuda_visible_devices_moves_the_binding(
    eight_gpus: FakeNvml, sysfs: str, manager: LauncherPluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,1")
    nproc, provider = resolve_nproc_per_node("gpu", manager)
    assert nproc == 2
    assert plan_affinity("node", nproc, provider, manager, sysfs_root=sysfs, on_failure="error") == [
        NODE1,
        NODE0,
    ]
    assert plan_affinity("exclusive", nproc, provider, manager, sysfs_root=sysfs, on_failure="error") == [
        NODE1,
        NODE0,
    ]


def test_a_numeric_nproc_binds_to_the_gpus_auto_finds(
    eight_gpus: FakeNvml, sysfs: str, manager: LauncherPluginManager
) -> None:
    nproc, provider = resolve_nproc_per_node("8", manager)
    assert provider is None
    plan = plan_affinity("exclusive", nproc, provider, manager, sysfs_root=sysfs, on_failure="error")
    assert plan == [frozenset({cpu}) for cpu in range(8)]


def test_the_auto_registration_itself_follows_the_provider_it_picks(
    eight_gpus: FakeNvml, sysfs: str, manager: LauncherPluginManager
) -> None:
    auto = manager.get(DeviceProvider, "auto")
    assert isinstance(auto, DeviceProvider)
    plan = plan_affinity("node", 8, auto, manager, sysfs_root=sysfs, on_failure="error")
    assert plan == [NODE0] * 4 + [NODE1] * 4
