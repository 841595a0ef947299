"""resolve_nproc_per_node: numbers, names, auto, and its one-line errors."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from launcher.devices import resolve_nproc_per_node
from launcher.devices.errors import DeviceUnavailableError
from launcher.errors import UsageError
from launcher.plugins import hookimpl
from launcher.plugins.manager import LauncherPluginManager, PluginNotFoundError
from launcher.plugins.types import DeviceProvider

from .conftest import FakeNvml


class ProviderPlugin:
    """Registers the given providers, as a third-party plugin module would."""

    def __init__(self, *providers: DeviceProvider) -> None:
        self.providers = providers

    @hookimpl
    def launcher_device_providers(self) -> Iterator[DeviceProvider]:
        yield from self.providers


def _fail() -> int:
    raise RuntimeError("driver exploded\nsecond line of the traceback text")


@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("8", 8), ("4096", 4096)])
def test_numbers_load_no_provider(value: str, expected: int) -> None:
    class Exploding:
        @hookimpl
        def launcher_device_providers(self) -> Iterator[DeviceProvider]:
            raise AssertionError("a number must not collect device providers")

    manager = LauncherPluginManager()
    manager.register_plugin(Exploding())
    assert resolve_nproc_per_node(value, manager) == (expected, None)


@pytest.mark.parametrize("value", ["0", "-1", " -8 ", " 4 ", "+2", "2\n", "1_0", "٢_٢", "9_999", "2.5", "4097", ""])
def test_counts_are_plain_ascii_decimal_in_range(value: str, manager: LauncherPluginManager) -> None:
    """Anything that does not start with a letter is a count: int() would take "1_0" or "٢"."""
    with pytest.raises(UsageError) as info:
        resolve_nproc_per_node(value, manager)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("--nproc-per-node must be an integer from 1 to 4096, got ")


@pytest.mark.parametrize("value", ["cdua", "two"])
def test_unknown_names_raise_the_managers_not_found_error(value: str, manager: LauncherPluginManager) -> None:
    with pytest.raises(PluginNotFoundError) as info:
        resolve_nproc_per_node(value, manager)
    message = str(info.value)
    assert "\n" not in message
    assert "auto, cpu, cuda, gpu, privateuse1, xpu" in message


def test_cpu_counts_the_process_affinity_not_the_host(manager: LauncherPluginManager) -> None:
    count, provider = resolve_nproc_per_node("cpu", manager)
    assert count == len(os.sched_getaffinity(0))
    assert provider is not None and provider.name == "cpu" and not provider.accelerator


def test_cpu_follows_a_narrowed_affinity(
    manager: LauncherPluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert resolve_nproc_per_node("cpu", manager)[0] == 1


def test_auto_prefers_cuda(fake_nvml: FakeNvml, manager: LauncherPluginManager) -> None:
    count, provider = resolve_nproc_per_node("auto", manager)
    assert count == 4
    assert provider is not None and provider.name == "cuda"


def test_auto_falls_back_to_cpu_without_accelerators(no_nvml: None, manager: LauncherPluginManager) -> None:
    count, provider = resolve_nproc_per_node("auto", manager)
    assert provider is not None and provider.name == "cpu"
    assert count == len(os.sched_getaffinity(0))


def test_auto_falls_back_to_cpu_when_nvml_lists_no_gpu(
    fake_nvml: FakeNvml, manager: LauncherPluginManager
) -> None:
    fake_nvml.configure([])
    assert resolve_nproc_per_node("auto", manager)[1].name == "cpu"  # type: ignore[union-attr]


def test_auto_follows_priority(fake_nvml: FakeNvml, manager: LauncherPluginManager) -> None:
    first = DeviceProvider(name="npu-test", count_devices=lambda: 2, priority=5)
    manager.register_plugin(ProviderPlugin(first))
    assert resolve_nproc_per_node("auto", manager) == (2, first)


def test_auto_reaches_plugins_after_the_builtins(no_nvml: None, manager: LauncherPluginManager) -> None:
    late = DeviceProvider(name="npu-test", count_devices=lambda: 3)  # default priority 100
    manager.register_plugin(ProviderPlugin(late))
    assert resolve_nproc_per_node("auto", manager) == (3, late)


def test_auto_skips_a_broken_accelerator_with_a_warning(
    no_nvml: None, manager: LauncherPluginManager, caplog: pytest.LogCaptureFixture
) -> None:
    broken = DeviceProvider(name="broken", count_devices=_fail, priority=1)
    manager.register_plugin(ProviderPlugin(broken))
    with caplog.at_level(logging.WARNING, logger="launcher.devices"):
        assert resolve_nproc_per_node("auto", manager)[1].name == "cpu"  # type: ignore[union-attr]
    assert "skipped device provider 'broken'" in caplog.text


def test_auto_skips_unavailable_kinds_quietly(
    no_nvml: None, manager: LauncherPluginManager, caplog: pytest.LogCaptureFixture
) -> None:
    def unavailable() -> int:
        raise DeviceUnavailableError("no such driver")

    manager.register_plugin(
        ProviderPlugin(DeviceProvider(name="quiet", count_devices=unavailable, priority=1))
    )
    with caplog.at_level(logging.WARNING, logger="launcher.devices"):
        assert resolve_nproc_per_node("auto", manager)[1].name == "cpu"  # type: ignore[union-attr]
    assert "quiet" not in caplog.text


def test_provider_with_no_device_is_a_one_line_usage_error(manager: LauncherPluginManager) -> None:
    manager.register_plugin(
        ProviderPlugin(
            DeviceProvider(name="npu-test", count_devices=lambda: 0, visible_devices_env="NPU_VIS")
        )
    )
    with pytest.raises(UsageError) as info:
        resolve_nproc_per_node("npu-test", manager)
    assert str(info.value) == (
        "--nproc-per-node npu-test: no npu-test devices are visible to this process; give a number of "
        "workers (e.g. --nproc-per-node 1) or --nproc-per-node auto"
    )


def test_provider_that_fails_is_a_one_line_usage_error(manager: LauncherPluginManager) -> None:
    manager.register_plugin(ProviderPlugin(DeviceProvider(name="npu-test", count_devices=_fail)))
    with pytest.raises(UsageError) as info:
        resolve_nproc_per_node("npu-test", manager)
    assert str(info.value) == (
        "--nproc-per-node npu-test: cannot count npu-test devices: driver exploded; "
        "give a number of workers instead (e.g. --nproc-per-node 1)"
    )


def test_xpu_on_a_torch_without_xpu(manager: LauncherPluginManager, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.devices import torch_backends

    monkeypatch.setattr(
        torch_backends,
        "torch_build_flags",
        lambda: {"cuda": None, "hip": None, "xpu": None, "version": "2.13.0"},
    )
    with pytest.raises(UsageError) as info:
        resolve_nproc_per_node("xpu", manager)
    assert "\n" not in str(info.value)
    assert "cannot count xpu devices: torch 2.13.0 was built without XPU support" in str(info.value)


def test_auto_without_a_cpu_provider(no_nvml: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.devices.providers import builtin_providers

    class OnlyAuto:
        @hookimpl
        def launcher_device_providers(self) -> Iterator[DeviceProvider]:
            yield next(p for p in builtin_providers() if p.name == "auto")

    manager = LauncherPluginManager()
    manager.register_plugin(OnlyAuto())
    with pytest.raises(UsageError, match="cannot choose a device kind: no accelerator has a device"):
        resolve_nproc_per_node("auto", manager)


def test_resolution_is_logged(manager: LauncherPluginManager, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="launcher.devices"):
        count, _ = resolve_nproc_per_node("cpu", manager)
    assert f"{count} workers, one per cpu device" in caplog.text
